// The document's tables (report_internal.h): provenance, the summary by family and one table
// per case, with the cell formatting they share.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <set>

#include "reports/report_internal.h"

namespace sb::reports {

// ---- formatting ----------------------------------------------------------------------------

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

namespace {

std::string bytes(const std::optional<int64_t>& v) {
  if (!v) return "-";
  const double b = static_cast<double>(*v);
  if (b < 1024) return std::to_string(*v) + " B";
  if (b < 1024.0 * 1024) return fmt("%.1f KiB", b / 1024);
  if (b < 1024.0 * 1024 * 1024) return fmt("%.1f MiB", b / 1024 / 1024);
  return fmt("%.2f GiB", b / 1024 / 1024 / 1024);
}

std::string timeText(const ResultRow& r) {
  if (!r.timeMedianUs) return "-";
  std::string s = fmt("%.4g", *r.timeMedianUs);
  if (r.timeStddevUs) s += " ± " + fmt("%.2g", *r.timeStddevUs);
  return s;
}

std::string pctText(const std::optional<double>& v) { return v ? fmt("%+.1f%%", *v) : ""; }

std::string predictedVsMeasured(const std::optional<int64_t>& pred,
                                const std::optional<int64_t>& meas) {
  if (!pred && !meas) return "-";
  return bytes(pred) + " / " + bytes(meas);
}

std::string errText(const ResultRow& r) {
  if (!r.errRatio) return r.maxAbsErr ? "abs " + fmt("%.2g", *r.maxAbsErr) : "-";
  return fmt("%.3g", *r.errRatio) + (r.worstTensor.empty() ? "" : " (" + r.worstTensor + ")");
}

}  // namespace

std::set<std::string> distinct(const std::vector<ResultRow>& rows, std::string ResultRow::*field) {
  std::set<std::string> s;
  for (const auto& r : rows) s.insert(r.*field);
  return s;
}

std::string joined(const std::set<std::string>& s) {
  std::string o;
  for (const auto& x : s) o += (o.empty() ? "" : ", ") + x;
  return o.empty() ? "-" : o;
}

namespace {

Cell statusCell(const std::string& s) { return {s.empty() ? "-" : s, s}; }

}  // namespace

Table provenanceTable(const std::vector<ResultRow>& cur, const std::vector<ResultRow>& base) {
  Table t;
  t.id = "provenance";
  t.head = {"", "results"};
  if (!base.empty()) t.head.push_back("baseline");
  const std::vector<std::pair<std::string, std::string ResultRow::*>> fields = {
      {"git sha", &ResultRow::gitSha},  {"host", &ResultRow::host},
      {"device", &ResultRow::device},   {"LibTorch", &ResultRow::torchVersion},
      {"backend", &ResultRow::backend}, {"suite", &ResultRow::suite},
      {"run id", &ResultRow::runId},    {"started (UTC)", &ResultRow::timestampUtc}};
  for (const auto& [name, field] : fields) {
    std::vector<Cell> row = {{name, ""}, {joined(distinct(cur, field)), ""}};
    if (!base.empty()) row.push_back({joined(distinct(base, field)), ""});
    t.rows.push_back(std::move(row));
  }
  std::set<std::string> files;
  for (const auto& r : cur) files.insert(r.file);
  std::vector<Cell> row = {{"files", ""}, {joined(files), ""}};
  if (!base.empty()) {
    std::set<std::string> bf;
    for (const auto& r : base) bf.insert(r.file);
    row.push_back({joined(bf), ""});
  }
  t.rows.push_back(std::move(row));
  return t;
}

Table familyTable(const Comparison& cmp) {
  static const std::vector<std::string> kStatuses = {"pass", "fail", "error", "unsupported",
                                                     "skipped"};
  static const std::vector<Verdict> kVerdicts = {
      Verdict::kRegressed, Verdict::kImproved, Verdict::kUnchanged, Verdict::kNew, Verdict::kGone};
  std::map<std::string, std::map<std::string, int>> counts;
  std::vector<std::string> order;
  for (const auto& rc : cmp.rows) {
    const std::string fam = rc.any().family;
    if (!counts.count(fam)) order.push_back(fam);
    auto& c = counts[fam];
    if (rc.current) c[rc.current->status]++;
    c[verdictName(rc.verdict)]++;
    c["gate findings"] += !rc.gateFailures.empty();
  }
  Table t;
  t.id = "summary";
  t.head = {"family"};
  for (const auto& s : kStatuses) t.head.push_back(s);
  t.head.push_back("rows failing the gate");
  if (cmp.hasBaseline) {
    for (auto v : kVerdicts) t.head.push_back(verdictName(v));
  }
  for (const auto& fam : order) {
    std::vector<Cell> row = {{fam, ""}};
    for (const auto& s : kStatuses) {
      const int n = counts[fam][s];
      row.push_back({std::to_string(n), n ? s : ""});
    }
    const int g = counts[fam]["gate findings"];
    row.push_back({std::to_string(g), g ? "fail" : ""});
    if (cmp.hasBaseline) {
      for (auto v : kVerdicts) {
        const int n = counts[fam][verdictName(v)];
        row.push_back({std::to_string(n), n ? verdictName(v) : ""});
      }
    }
    t.rows.push_back(std::move(row));
  }
  return t;
}

Table caseTable(const std::vector<const RowComparison*>& rows, bool hasBaseline,
                const std::string& id) {
  Table t;
  t.id = id;
  t.head = {"strategy",
            "status",
            "err / tol (worst tensor)",
            "tolerance",
            "time us (median ± sd)",
            "peak mem",
            "mem predicted / measured",
            "comm predicted / measured"};
  if (hasBaseline) {
    for (const char* h : {"baseline status", "Δ time", "Δ mem", "verdict"}) t.head.push_back(h);
  }
  t.head.push_back("notes");
  for (const RowComparison* rc : rows) {
    const ResultRow& a = rc->any();
    const ResultRow* c = rc->current;
    std::vector<Cell> row;
    row.push_back(
        {a.strategy.empty() ? a.strategyId : a.strategy + "  [" + a.strategyId + "]", ""});
    row.push_back(statusCell(c ? c->status : "gone"));
    row.push_back({c ? errText(*c) : "-", ""});
    std::string tol = "-";
    if (c && c->atol && c->rtol) {
      tol = (*c->atol == 0 && *c->rtol == 0)
                ? "bitwise"
                : "rtol " + fmt("%.2g", *c->rtol) + " atol " + fmt("%.2g", *c->atol);
    }
    row.push_back({tol, ""});
    row.push_back({c ? timeText(*c) + (rc->noisy ? " (noisy)" : "") : "-", ""});
    row.push_back({c ? bytes(c->peakMemBytes) : "-", ""});
    // The peak's own claim: "memory" among the names (held_memory is another claim, below it).
    const bool memOff = c && ("+" + c->mispredicted + "+").find("+memory+") != std::string::npos;
    row.push_back({c ? predictedVsMeasured(c->predictedMemBytes, c->peakMemBytes) +
                           (memOff ? " (mispredicted)" : "")
                     : "-",
                   memOff ? "fail" : ""});
    row.push_back({c ? predictedVsMeasured(c->predictedCommBytes, c->commBytes) : "-", ""});
    if (hasBaseline) {
      row.push_back(statusCell(rc->baseline ? rc->baseline->status : "new"));
      row.push_back({pctText(rc->timeChangePct) +
                         (rc->time == "n/a" || rc->time == "unchanged" ? "" : " " + rc->time),
                     rc->time == "regressed" || rc->time == "improved" ? rc->time : ""});
      row.push_back({pctText(rc->memChangePct),
                     rc->mem == "regressed" || rc->mem == "improved" ? rc->mem : ""});
      row.push_back({verdictName(rc->verdict), verdictName(rc->verdict)});
    }
    std::string notes = reasons(*rc);
    if (notes.empty() && c && c->status != "pass") notes = c->message;
    row.push_back({notes, rc->gateFailures.empty() ? "" : "fail"});
    t.rows.push_back(std::move(row));
  }
  return t;
}

namespace {

// `j[key]` where it is a string, else "" (a results file is not trusted).
std::string textOf(const nlohmann::json& j, const char* key) {
  return j.is_object() && j.contains(key) && j.at(key).is_string() ? j.at(key).get<std::string>()
                                                                   : "";
}

}  // namespace

Table divergenceTable(const std::vector<ResultRow>& rows) {
  Table t;
  t.id = "divergence";
  t.head = {"case",   "strategy", "status", "first diverging node", "phase", "rank(s)",
            "tensor", "value",    "error"};
  std::vector<const ResultRow*> order;
  for (const auto& r : rows) {
    if (!r.firstDivergence.is_null() && r.isBad()) order.push_back(&r);
  }
  for (const auto& r : rows) {
    if (!r.firstDivergence.is_null() && !r.isBad()) order.push_back(&r);
  }
  for (const ResultRow* r : order) {
    const nlohmann::json& d = r->firstDivergence;
    std::vector<Cell> row = {{r->caseName, ""}, {r->strategyId, ""}, {r->status, r->status}};
    const auto text = [&](const char* k) { return textOf(d, k); };
    const auto blanks = [&row](int n) {
      for (int i = 0; i < n; ++i) row.push_back({"", ""});
    };
    if (d.contains("error")) {
      row.push_back({"not located: " + text("error"), "warn"});
      blanks(5);
    } else if (!d.value("found", false)) {
      row.push_back({"none: every traced value within its tolerance", ""});
      blanks(3);
      row.push_back({std::to_string(d.value("compared", 0)) + " compared", ""});
      blanks(1);
    } else {
      std::string ranks;
      for (const auto& x : d.value("ranks", nlohmann::json::array())) {
        ranks += (ranks.empty() ? "" : ", ") + std::to_string(x.get<int>());
      }
      const nlohmann::json check = d.value("check", nlohmann::json::object());
      const nlohmann::json maxAbs = check.value("max_abs_err", nlohmann::json(0.0));
      // A piece that could not be compared (a box of another shape) says why.
      const std::string err =
          check.contains("problem") && check.at("problem").is_string()
              ? check.at("problem").get<std::string>()
              : "max abs err " +
                    (maxAbs.is_number() ? fmt("%.3g", maxAbs.get<double>()) : maxAbs.dump()) +
                    ", " + std::to_string(check.value("mismatches", 0)) + "/" +
                    std::to_string(check.value("numel", 0)) + " elements off";
      row.push_back({text("node"), "fail"});
      row.push_back({text("phase"), ""});
      row.push_back({ranks.empty() ? std::to_string(d.value("rank", 0)) : ranks, ""});
      row.push_back({text("tensor"), ""});
      row.push_back({d.contains("index") ? std::to_string(d.value("index", 0) + 1) + " of " +
                                               std::to_string(d.value("of", 0))
                                         : "the step's one node",
                     ""});
      row.push_back({err, ""});
    }
    t.rows.push_back(row);
  }
  return t;
}

namespace {

// "3x 1.5 KiB" ("-" for no calls).
std::string callsText(const nlohmann::json& c) {
  if (!c.is_object() || !c.contains("calls") || !c.at("calls").is_number_integer()) return "-";
  const int64_t calls = c.at("calls").get<int64_t>();
  const int64_t b =
      c.contains("bytes") && c.at("bytes").is_number_integer() ? c.at("bytes").get<int64_t>() : 0;
  return std::to_string(calls) + "x " + bytes(b);
}

std::string rangesText(const std::vector<int64_t>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    // (A file's ranks are not trusted: no overflow at the largest.)
    while (j + 1 < ranks.size() && ranks[j] < INT64_MAX && ranks[j + 1] == ranks[j] + 1) ++j;
    out += (out.empty() ? "" : ", ") + std::to_string(ranks[i]) +
           (j > i ? "-" + std::to_string(ranks[j]) : "");
    i = j + 1;
  }
  return out;
}

// One row's table; nullopt where its comm_by_node has nothing readable.
std::optional<CommNodeTable> commNodeTable(const ResultRow& r, size_t index) {
  struct Line {
    std::string node, phase, collective, counted, predicted;
    bool differs = false;
    std::vector<int64_t> ranks;
  };
  std::vector<Line> lines;
  std::map<std::string, size_t> at;
  std::set<std::pair<std::string, std::string>> nodes;
  bool perNode = true;
  std::string firstDiff;
  for (const auto& rank : r.commByNode) {
    if (!rank.is_object() || !rank.contains("nodes") || !rank.at("nodes").is_array()) continue;
    const int64_t rk = rank.contains("rank") && rank.at("rank").is_number_integer()
                           ? rank.at("rank").get<int64_t>()
                           : -1;
    const bool predicted = rank.contains("predicted_per_node") &&
                           rank.at("predicted_per_node").is_boolean() &&
                           rank.at("predicted_per_node").get<bool>();
    perNode = perNode && predicted;
    for (const auto& n : rank.at("nodes")) {
      const nlohmann::json none = nlohmann::json::object();
      const nlohmann::json& counted =
          n.is_object() && n.contains("counted") ? n.at("counted") : none;
      const nlohmann::json& pred =
          n.is_object() && n.contains("predicted") ? n.at("predicted") : none;
      if (!counted.is_object() || !pred.is_object()) continue;
      std::set<std::string> kinds;
      for (const auto& [k, v] : counted.items()) kinds.insert(k);
      for (const auto& [k, v] : pred.items()) kinds.insert(k);
      const std::string node = textOf(n, "node"), phase = textOf(n, "phase");
      nodes.insert({node, phase});
      for (const auto& k : kinds) {
        // Judged and merged on the figures as written, not on their rounded text.
        const nlohmann::json c = counted.value(k, nlohmann::json()),
                             p = pred.value(k, nlohmann::json());
        Line l{node.empty() ? "(outside the nodes)" : node,
               phase,
               k,
               callsText(c),
               predicted ? callsText(p) : "(total only)",
               predicted && c != p,
               {}};
        if (l.differs && firstDiff.empty()) {
          firstDiff = l.node + " (" + l.phase + ") on rank " + std::to_string(rk);
        }
        const std::string key = l.node + "\x1f" + l.phase + "\x1f" + k + "\x1f" + c.dump() +
                                "\x1f" + (predicted ? p.dump() : "-");
        auto [it, fresh] = at.try_emplace(key, lines.size());
        if (fresh) lines.push_back(std::move(l));
        lines[it->second].ranks.push_back(rk);
      }
    }
  }
  if (lines.empty()) return std::nullopt;
  CommNodeTable out;
  out.differs = !firstDiff.empty();
  out.table.id = "comm-by-node-" + std::to_string(index);
  out.table.head = {"node", "phase", "collective", "ranks", "counted", "predicted"};
  for (auto& l : lines) {
    std::sort(l.ranks.begin(), l.ranks.end());
    out.table.rows.push_back({{l.node, ""},
                              {l.phase, ""},
                              {l.collective, ""},
                              {rangesText(l.ranks), ""},
                              {l.counted, l.differs ? "fail" : ""},
                              {l.predicted, l.differs ? "fail" : ""}});
  }
  out.summary = r.caseName + " / " + r.strategyId + " (" + r.backend +
                "): " + std::to_string(nodes.size()) + " node phases communicate; " +
                (out.differs ? "counted and predicted part first at " + firstDiff
                 : perNode   ? "counted as predicted at every node"
                             : "predicted as a total only");
  return out;
}

}  // namespace

std::vector<CommNodeTable> commNodeTables(const std::vector<ResultRow>& rows, size_t limit) {
  std::vector<CommNodeTable> differ, agree;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (!rows[i].commByNode.is_array()) continue;
    if (auto t = commNodeTable(rows[i], i)) (t->differs ? differ : agree).push_back(std::move(*t));
  }
  for (auto& t : agree) differ.push_back(std::move(t));
  if (differ.size() > limit) differ.resize(limit);
  return differ;
}

}  // namespace sb::reports
