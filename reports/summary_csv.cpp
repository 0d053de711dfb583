// The report's CSV outputs (report_internal.h): summary.csv, tensors.csv and history.csv, a
// row each per comparison, per tensor's error and per run's result.

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <map>

#include "harness/hidden_text.h"
#include "harness/run/records.h"
#include "reports/report.h"
#include "reports/report_internal.h"

namespace sb::reports {
namespace fs = std::filesystem;
namespace {

// ---- outputs --------------------------------------------------------------------------------

// A cell as a spreadsheet shows it, never runs it: text that starts with = + - @ (a case name,
// a message, a shape from a results file) gets the results files' leading quote
// (harness::csvTextField); a number, a negative change included, stays a number.
std::string defusedCell(const std::string& field) {
  if (field.empty()) return field;
  char* end = nullptr;
  std::strtod(field.c_str(), &end);
  const bool number =
      end == field.c_str() + field.size() && !std::isspace(static_cast<unsigned char>(field[0]));
  return number ? field : harness::csvTextField(field);
}

std::string csvLine(const std::vector<std::string>& fields) {
  std::string s;
  for (size_t i = 0; i < fields.size(); ++i) {
    // What a terminal acts on (ESC from a run folder's name) as an escape: `cat history.csv`.
    s += (i ? "," : "") +
         harness::csvQuote(defusedCell(harness::escapeHidden(fields[i], harness::TextKind::kLine)));
  }
  return s + "\n";
}

std::string optInt(const std::optional<int64_t>& v) { return v ? std::to_string(*v) : ""; }

std::string gateCell(const RowComparison& rc) {
  if (!rc.gateFailures.empty()) return "fail";
  if (!rc.warnings.empty()) return "warn";
  return "ok";
}

}  // namespace

std::string reasons(const RowComparison& rc) {
  std::string s;
  for (const auto& f : rc.gateFailures) s += (s.empty() ? "" : "; ") + f;
  for (const auto& w : rc.warnings) s += (s.empty() ? "" : "; ") + w;
  return s;
}

namespace {

std::string paramsText(const std::vector<std::pair<std::string, std::string>>& params) {
  std::string s;
  for (const auto& [k, v] : params) s += (s.empty() ? "" : ";") + k + "=" + v;
  return s;
}

std::optional<std::string> paramOf(const ResultRow& r, const std::string& key) {
  for (const auto& [k, v] : r.params) {
    if (k == key) return v;
  }
  return std::nullopt;
}

// A swept case's family: "prefill-1024/chunk=64" -> "prefill-1024".
std::string sweepBase(const std::string& caseName) {
  const size_t slash = caseName.rfind('/');
  if (slash == std::string::npos || caseName.find('=', slash) == std::string::npos) return caseName;
  return caseName.substr(0, slash);
}

// Chunking rows against the unchunked run of the same strategy in the same swept case (the
// row whose params say chunks=1): activation memory saved and time lost, in %.
struct AgainstUnchunked {
  std::map<std::string, const ResultRow*> unchunked;
  explicit AgainstUnchunked(const Comparison& cmp) {
    for (const auto& rc : cmp.rows) {
      const ResultRow* c = rc.current;
      if (c && c->status == "pass" && paramOf(*c, "chunks") == std::optional<std::string>("1")) {
        unchunked[key(*c)] = c;
      }
    }
  }
  static std::string key(const ResultRow& r) {
    return r.suite + "|" + sweepBase(r.caseName) + "|" + r.strategyId;
  }
  std::pair<std::string, std::string> of(const ResultRow* c) const {
    if (!c || c->status != "pass") return {"", ""};
    const auto it = unchunked.find(key(*c));
    const auto act = paramOf(*c, "activation_peak_bytes");
    if (it == unchunked.end() || !act) return {"", ""};
    const auto base = paramOf(*it->second, "activation_peak_bytes");
    std::string reduction, slowdown;
    if (base && std::stod(*base) > 0) {
      reduction = harness::formatDouble((1 - std::stod(*act) / std::stod(*base)) * 100);
    }
    if (c->timeMedianUs && it->second->timeMedianUs && *it->second->timeMedianUs > 0) {
      slowdown = harness::formatDouble((*c->timeMedianUs / *it->second->timeMedianUs - 1) * 100);
    }
    return {reduction, slowdown};
  }
};

}  // namespace

std::string summaryCsv(const Comparison& cmp) {
  const AgainstUnchunked against(cmp);
  std::string out = csvLine({"suite",
                             "case",
                             "case_slug",
                             "workload",
                             "shape",
                             "dtype",
                             "mesh",
                             "backend",
                             "family",
                             "strategy_id",
                             "strategy",
                             "status",
                             "baseline_status",
                             "err_ratio",
                             "baseline_err_ratio",
                             "worst_tensor",
                             "max_abs_err",
                             "atol",
                             "rtol",
                             "time_us_median",
                             "time_us_stddev",
                             "repetitions",
                             "baseline_time_us_median",
                             "baseline_time_us_stddev",
                             "time_change_pct",
                             "time_p_value",
                             "time_verdict",
                             "noisy",
                             "peak_mem_bytes",
                             "baseline_peak_mem_bytes",
                             "mem_change_pct",
                             "mem_verdict",
                             "predicted_mem_bytes",
                             "comm_bytes",
                             "predicted_comm_bytes",
                             "predicted_time_us",
                             "params",
                             "activation_reduction_pct",
                             "slowdown_pct",
                             "numerics_verdict",
                             "prediction_verdict",
                             "verdict",
                             "gate",
                             "reasons",
                             "time_us_min",
                             "time_us_max",
                             "baseline_time_us_min",
                             "baseline_time_us_max",
                             "time_class",
                             "time_band_pct"});
  const auto f = [](const std::optional<double>& v) {
    return v ? harness::formatDouble(*v) : std::string();
  };
  for (const auto& rc : cmp.rows) {
    const ResultRow& a = rc.any();
    const ResultRow* c = rc.current;
    const ResultRow* b = rc.baseline;
    const auto vsUnchunked = against.of(c);
    out += csvLine({a.suite,
                    a.caseName,
                    caseSlug(a.suite, a.caseName),
                    a.workload,
                    a.shape,
                    a.dtype,
                    a.mesh,
                    a.backend,
                    a.family,
                    a.strategyId,
                    a.strategy,
                    c ? c->status : "",
                    b ? b->status : "",
                    c ? f(c->errRatio) : "",
                    b ? f(b->errRatio) : "",
                    c ? c->worstTensor : "",
                    c ? f(c->maxAbsErr) : "",
                    c ? f(c->atol) : "",
                    c ? f(c->rtol) : "",
                    c ? f(c->timeMedianUs) : "",
                    c ? f(c->timeStddevUs) : "",
                    c ? std::to_string(c->repetitions) : "",
                    b ? f(b->timeMedianUs) : "",
                    b ? f(b->timeStddevUs) : "",
                    f(rc.timeChangePct),
                    f(rc.timePValue),
                    rc.time,
                    rc.noisy ? "1" : "0",
                    c ? optInt(c->peakMemBytes) : "",
                    b ? optInt(b->peakMemBytes) : "",
                    f(rc.memChangePct),
                    rc.mem,
                    c ? optInt(c->predictedMemBytes) : "",
                    c ? optInt(c->commBytes) : "",
                    c ? optInt(c->predictedCommBytes) : "",
                    c ? f(c->predictedTimeUs) : "",
                    c ? paramsText(c->params) : "",
                    vsUnchunked.first,
                    vsUnchunked.second,
                    rc.numerics,
                    rc.prediction,
                    verdictName(rc.verdict),
                    gateCell(rc),
                    reasons(rc),
                    c ? f(c->timeMinUs) : "",
                    c ? f(c->timeMaxUs) : "",
                    b ? f(b->timeMinUs) : "",
                    b ? f(b->timeMaxUs) : "",
                    rc.timeClass,
                    f(rc.timeBandPct)});
  }
  return out;
}

std::string tensorsCsv(const std::vector<ResultRow>& rows) {
  std::string out = csvLine(
      {"suite", "case", "case_slug", "strategy_id", "strategy", "status", "tensor", "err_ratio"});
  for (const auto& r : rows) {
    for (const auto& [t, v] : r.tensorErrRatio) {
      out += csvLine({r.suite, r.caseName, caseSlug(r.suite, r.caseName), r.strategyId, r.strategy,
                      r.status, t, harness::formatDouble(v)});
    }
  }
  return out;
}

std::string historyCsv(const std::vector<HistoryRun>& runs) {
  std::string out =
      csvLine({"run_index", "run_dir", "run_id", "timestamp_utc", "git_sha", "suite", "case",
               "case_slug", "strategy_id", "strategy", "status", "time_us_median"});
  for (size_t i = 0; i < runs.size(); ++i) {
    for (const auto& r : runs[i].rows) {
      out += csvLine({std::to_string(i), fs::path(runs[i].dir).filename().string(), r.runId,
                      runs[i].timestamp, r.gitSha, r.suite, r.caseName,
                      caseSlug(r.suite, r.caseName), r.strategyId, r.strategy, r.status,
                      r.timeMedianUs ? harness::formatDouble(*r.timeMedianUs) : ""});
    }
  }
  return out;
}

}  // namespace sb::reports
