// What the report leads with (report_internal.h): what changed since the
// baseline, the slowest and the most regressed rows, what did not run and why; and the gate's
// findings for a team's CI to read natively: gate.json and JUnit XML.

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "reports/report_internal.h"

namespace sb::reports {
namespace {

std::string rowLabel(const ResultRow& r) {
  return r.suite + "/" + r.caseName + " " + r.strategyId + " [" + r.backend + "]";
}

std::string joinedReasons(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : "; ") + x;
  return s;
}

// The kinds of change, in the order a team lead reads them.
struct Change {
  std::string kind, cls;
  const RowComparison* rc;
  std::string detail;
};

std::vector<Change> changesOf(const Comparison& cmp) {
  std::vector<Change> out;
  const auto add = [&](const std::string& kind, const std::string& cls, const RowComparison& rc,
                       std::string detail) { out.push_back({kind, cls, &rc, std::move(detail)}); };
  for (const auto& rc : cmp.rows) {
    if (rc.numerics == "new failure" || rc.numerics == "regressed") {
      add("newly failing", "fail", rc, joinedReasons(rc.gateFailures));
    }
  }
  for (const auto& rc : cmp.rows) {
    if (rc.mem == "regressed") {
      add("regressed (memory)", "regressed", rc,
          (rc.memChangePct ? fmt("%+.1f%%", *rc.memChangePct) + " peak"
                           : std::string("peak from 0 bytes")));
    }
    if (rc.timeClass == "regression") {
      add("regressed (time)", "regressed", rc,
          fmt("%+.1f%%", rc.timeChangePct.value_or(0)) + " median, band " +
              fmt("%.3g%%", rc.timeBandPct.value_or(0)) + ", p = " +
              fmt("%.2g", rc.timePValue.value_or(NAN)));
    }
  }
  for (const auto& rc : cmp.rows) {
    if (rc.current && !rc.current->mispredicted.empty()) {
      add("mispredicted", "fail", rc, rc.prediction);
    }
  }
  for (const auto& rc : cmp.rows) {
    if (rc.timeClass == "suspicious" || rc.timeClass == "insufficient data") {
      add(rc.timeClass + " (time)", "warn", rc,
          fmt("%+.1f%%", rc.timeChangePct.value_or(0)) + " median (" + rc.time + ")");
    }
  }
  for (const auto& rc : cmp.rows) {
    if (rc.numerics == "fixed") add("fixed", "fixed", rc, "was " + rc.baseline->status);
    if (rc.mem == "improved") {
      add("improved (memory)", "improved", rc,
          (rc.memChangePct ? fmt("%+.1f%%", *rc.memChangePct) + " peak"
                           : std::string("peak from 0 bytes")));
    }
    if (rc.timeClass == "improvement") {
      add(rc.largeImprovement ? "improved (time), unexplained" : "improved (time)",
          rc.largeImprovement ? "warn" : "improved", rc,
          fmt("%+.1f%%", rc.timeChangePct.value_or(0)) + " median, band " +
              fmt("%.3g%%", rc.timeBandPct.value_or(0)));
    }
  }
  for (const auto& rc : cmp.rows) {
    if (rc.verdict == Verdict::kGone) {
      add("gone", "gone", rc, joinedReasons(rc.gateFailures.empty() ? rc.warnings : rc.gateFailures));
    }
  }
  for (const auto& rc : cmp.rows) {
    if (rc.verdict == Verdict::kNew) add("new", "new", rc, rc.current->status);
  }
  return out;
}

}  // namespace

LeadTables leadTables(const Comparison& cmp, const std::vector<ResultRow>& current, size_t limit) {
  LeadTables t;
  // What changed.
  const auto changes = changesOf(cmp);
  t.changes.id = "changes";
  t.changes.head = {"change", "row", "what"};
  std::map<std::string, int> counts;
  for (const auto& c : changes) counts[c.kind]++;
  for (const auto& [kind, n] : counts) t.changeCounts.push_back({kind, n});
  t.changed = static_cast<int>(changes.size());
  for (size_t i = 0; i < changes.size() && i < limit; ++i) {
    const auto& c = changes[i];
    t.changes.rows.push_back({{c.kind, c.cls}, {rowLabel(c.rc->any()), ""}, {c.detail, ""}});
  }

  // Slowest rows, and the most regressed by time.
  std::vector<const ResultRow*> timed;
  for (const auto& r : current) {
    if (r.timeMedianUs && std::isfinite(*r.timeMedianUs)) timed.push_back(&r);
  }
  std::sort(timed.begin(), timed.end(), [](const ResultRow* a, const ResultRow* b) {
    return *a->timeMedianUs > *b->timeMedianUs;
  });
  t.slowest.id = "slowest";
  t.slowest.head = {"row", "median us", "repetitions", "status"};
  for (size_t i = 0; i < timed.size() && i < 10; ++i) {
    const ResultRow& r = *timed[i];
    t.slowest.rows.push_back({{rowLabel(r), ""},
                              {fmt("%.4g", *r.timeMedianUs), ""},
                              {std::to_string(r.repetitions), ""},
                              {r.status, r.status}});
  }
  std::vector<const RowComparison*> moved;
  for (const auto& rc : cmp.rows) {
    if (rc.timeChangePct) moved.push_back(&rc);
  }
  std::sort(moved.begin(), moved.end(), [](const RowComparison* a, const RowComparison* b) {
    return *a->timeChangePct > *b->timeChangePct;
  });
  t.mostRegressed.id = "most-regressed";
  t.mostRegressed.head = {"row", "Δ median time", "band", "class"};
  for (size_t i = 0; i < moved.size() && i < 10; ++i) {
    const RowComparison& rc = *moved[i];
    if (*rc.timeChangePct <= 0) break;
    t.mostRegressed.rows.push_back(
        {{rowLabel(rc.any()), ""},
         {fmt("%+.1f%%", *rc.timeChangePct), ""},
         {rc.timeBandPct ? fmt("%.3g%%", *rc.timeBandPct) : "-", ""},
         {rc.timeClass, rc.timeClass == "regression" ? "regressed" : ""}});
  }

  // What did not run, by reason.
  std::map<std::pair<std::string, std::string>, int> why;
  for (const auto& r : current) {
    if (r.status == "skipped" || r.status == "unsupported") {
      why[{r.status, r.message.empty() ? "(no reason given)" : r.message}]++;
    }
  }
  std::vector<std::pair<int, std::pair<std::string, std::string>>> byCount;
  for (const auto& [k, n] : why) byCount.push_back({n, k});
  std::stable_sort(byCount.begin(), byCount.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  t.notRun.id = "not-run";
  t.notRun.head = {"status", "rows", "reason"};
  for (size_t i = 0; i < byCount.size() && i < limit; ++i) {
    const auto& [n, k] = byCount[i];
    t.notRun.rows.push_back({{k.first, k.first}, {std::to_string(n), ""}, {k.second, ""}});
  }
  return t;
}

std::string gateJson(const Comparison& cmp, const std::vector<ResultRow>& current,
                     const GateOptions& o, bool enforced) {
  std::map<std::string, int> status;
  for (const auto& r : current) status[r.status]++;
  nlohmann::json rows = nlohmann::json::array();
  std::map<std::string, int> classes;
  for (const auto& rc : cmp.rows) {
    if (rc.timeClass != "n/a") classes[rc.timeClass]++;
    if (rc.gateFailures.empty() && rc.warnings.empty()) continue;
    const ResultRow& a = rc.any();
    rows.push_back({{"suite", a.suite},
                    {"case", a.caseName},
                    {"strategy_id", a.strategyId},
                    {"backend", a.backend},
                    {"status", rc.current ? rc.current->status : "gone"},
                    {"verdict", verdictName(rc.verdict)},
                    {"numerics", rc.numerics},
                    {"time_class", rc.timeClass},
                    {"time_change_pct", rc.timeChangePct ? nlohmann::json(*rc.timeChangePct)
                                                         : nlohmann::json()},
                    {"time_band_pct",
                     rc.timeBandPct ? nlohmann::json(*rc.timeBandPct) : nlohmann::json()},
                    {"memory", rc.mem},
                    {"prediction", rc.prediction},
                    {"failures", rc.gateFailures},
                    {"warnings", rc.warnings}});
  }
  const auto blockers = cmp.promotionBlockers();
  nlohmann::json j = {
      {"schema_version", 1},
      {"verdict", cmp.gateFailed() ? "fail" : "pass"},
      {"enforced", enforced},
      {"promotable", blockers.empty()},
      {"promotion_blockers", blockers},
      {"partial", cmp.partial},
      {"has_baseline", cmp.hasBaseline},
      {"noise", o.noise ? nlohmann::json(o.noise->file) : nlohmann::json()},
      {"time_gate", o.hardPerf ? "hard" : "soft"},
      {"rows", current.size()},
      {"status", status},
      {"time_classes", classes},
      {"failures", cmp.gateFailures()},
      {"warnings", cmp.warnings()},
      {"findings", rows}};
  return j.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

namespace {

// Text for an XML attribute or element: markup escaped, line breaks as character references
// (an attribute keeps them), control characters XML 1.0 forbids and bytes that are not valid
// UTF-8 as '?', so that the file stays well-formed whatever a row's message holds.
std::string xmlEscape(const std::string& s) {
  std::string o;
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    switch (c) {
      case '&': o += "&amp;"; continue;
      case '<': o += "&lt;"; continue;
      case '>': o += "&gt;"; continue;
      case '"': o += "&quot;"; continue;
      case '\'': o += "&apos;"; continue;
      case '\n': o += "&#10;"; continue;
      case '\r': o += "&#13;"; continue;
      case '\t': o += "&#9;"; continue;
      default: break;
    }
    if (c < 0x20) {
      o += '?';
      continue;
    }
    if (c < 0x80) {
      o += static_cast<char>(c);
      continue;
    }
    // A UTF-8 sequence: its lead byte's length, each continuation byte 10xxxxxx.
    const size_t n = c >= 0xF0 && c <= 0xF4 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 && c <= 0xDF ? 2 : 0;
    bool ok = n > 0 && i + n <= s.size();
    for (size_t k = 1; ok && k < n; ++k) ok = (static_cast<unsigned char>(s[i + k]) & 0xC0) == 0x80;
    if (!ok) {
      o += '?';
      continue;
    }
    o.append(s, i, n);
    i += n - 1;
  }
  return o;
}

bool notRun(const RowComparison& rc) {
  return rc.current && (rc.current->status == "skipped" || rc.current->status == "unsupported");
}

}  // namespace

std::string gateJunit(const Comparison& cmp) {
  // One <testsuite> per suite, one <testcase> per row (classname the case, name the strategy
  // and backend): its gate findings one <failure> (the first as the message, all in the
  // text), a skipped or unsupported row <skipped>, its warnings one <system-out>. Findings
  // about the run as a whole are a testcase of their own.
  std::map<std::string, std::vector<const RowComparison*>> bySuite;
  std::vector<std::string> order;
  for (const auto& rc : cmp.rows) {
    const std::string& s = rc.any().suite;
    if (!bySuite.count(s)) order.push_back(s);
    bySuite[s].push_back(&rc);
  }
  const auto failure = [](const std::vector<std::string>& why) {
    return "<failure message=\"" + xmlEscape(why.front()) + "\">" + xmlEscape(joinedReasons(why)) +
           "</failure>\n";
  };
  std::ostringstream o;
  int tests = 1, failures = !cmp.runFailures.empty(), skipped = 0;
  for (const auto& rc : cmp.rows) {
    ++tests;
    failures += !rc.gateFailures.empty();
    skipped += rc.gateFailures.empty() && notRun(rc);
  }
  o << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"stratbench gate\" tests=\""
    << tests << "\" failures=\"" << failures << "\" skipped=\"" << skipped << "\">\n";
  o << "<testsuite name=\"stratbench run\" tests=\"1\" failures=\"" << !cmp.runFailures.empty()
    << "\" skipped=\"0\">\n<testcase classname=\"run\" name=\"the run as a whole\">\n";
  if (!cmp.runFailures.empty()) o << failure(cmp.runFailures);
  if (!cmp.runWarnings.empty()) {
    o << "<system-out>" << xmlEscape(joinedReasons(cmp.runWarnings)) << "</system-out>\n";
  }
  o << "</testcase>\n</testsuite>\n";
  for (const auto& suite : order) {
    const auto& rows = bySuite[suite];
    int f = 0, s = 0;
    for (const auto* rc : rows) {
      f += !rc->gateFailures.empty();
      s += rc->gateFailures.empty() && notRun(*rc);
    }
    o << "<testsuite name=\"" << xmlEscape(suite) << "\" tests=\"" << rows.size()
      << "\" failures=\"" << f << "\" skipped=\"" << s << "\">\n";
    for (const auto* rc : rows) {
      const ResultRow& a = rc->any();
      o << "<testcase classname=\"" << xmlEscape(a.suite + "." + a.caseName) << "\" name=\""
        << xmlEscape(a.strategyId + " [" + a.backend + "]") << "\"";
      if (rc->current && rc->current->timeMedianUs && std::isfinite(*rc->current->timeMedianUs)) {
        o << " time=\"" << fmt("%.6f", *rc->current->timeMedianUs / 1e6) << "\"";
      }
      o << ">\n";
      if (!rc->gateFailures.empty()) {
        o << failure(rc->gateFailures);
      } else if (notRun(*rc)) {
        o << "<skipped message=\"" << xmlEscape(rc->current->status + ": " + rc->current->message)
          << "\"/>\n";
      }
      if (!rc->warnings.empty()) {
        o << "<system-out>" << xmlEscape(joinedReasons(rc->warnings)) << "</system-out>\n";
      }
      o << "</testcase>\n";
    }
    o << "</testsuite>\n";
  }
  o << "</testsuites>\n";
  return o.str();
}

}  // namespace sb::reports
