#include "reports/compare.h"

#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include "reports/stats.h"

namespace sb::reports {
namespace {

std::string pct(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%+.1f%%", v);
  return buf;
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

std::string rowName(const ResultRow& r) {
  return r.suite + "/" + r.caseName + " " + r.strategyId + " [" + r.backend + "]";
}

// A row that says pass but carries a NaN error, or an error past its tolerance, is not
// trusted: the numbers win over the status.
std::optional<std::string> inconsistentPass(const ResultRow& r) {
  if (r.status != "pass") return std::nullopt;
  if (r.maxAbsErr && std::isnan(*r.maxAbsErr)) return "max_abs_err is NaN although status is pass";
  if (r.errRatio && !(*r.errRatio <= 1.0)) {
    return "err_ratio " + num(*r.errRatio) + " exceeds its tolerance although status is pass";
  }
  return std::nullopt;
}

std::string failureText(const ResultRow& r) {
  std::string s = r.status;
  if (r.errRatio && r.status == "fail") s += " (err_ratio " + num(*r.errRatio) + ")";
  if (!r.message.empty()) s += ": " + r.message;
  return s;
}

void judgeNumerics(RowComparison& rc) {
  const ResultRow& cur = *rc.current;
  const auto odd = inconsistentPass(cur);
  const bool curBad = cur.isBad() || odd.has_value();
  const std::string curText = odd ? *odd : failureText(cur);
  const ResultRow* base = rc.baseline;

  if (!base || !(base->isBad() || base->status == "pass")) {
    // Nothing to compare with (new, or the baseline did not run it): judged on its own.
    if (curBad) {
      rc.numerics = "new failure";
      rc.gateFailures.push_back("numerics: " + curText);
    } else {
      rc.numerics = cur.status == "pass" ? "ok" : "n/a";
    }
    return;
  }
  const bool baseBad = base->isBad();
  if (curBad && !baseBad) {
    rc.numerics = "regressed";
    rc.gateFailures.push_back("numerics: was pass, now " + curText);
  } else if (curBad && baseBad) {
    if (cur.errRatio && base->errRatio && !(*cur.errRatio <= *base->errRatio)) {
      rc.numerics = "regressed";
      rc.gateFailures.push_back("numerics: the error grew past its tolerance, err_ratio " +
                                num(*base->errRatio) + " -> " + num(*cur.errRatio));
    } else {
      rc.numerics = "still failing";
      rc.warnings.push_back("numerics: still failing as in the baseline: " + curText);
    }
  } else if (!curBad && baseBad) {
    rc.numerics = "fixed";
  } else if (cur.status == "pass") {
    rc.numerics = "ok";
  } else {
    // pass -> unsupported / skipped: the strategy no longer runs this case.
    rc.numerics = "regressed";
    rc.gateFailures.push_back("numerics: was pass, now " + cur.status +
                              (cur.message.empty() ? "" : ": " + cur.message));
  }
}

// A prediction `run` found past its strategy's tolerance is a broken model: the row's own
// verdict, with or without a baseline.
void judgePrediction(RowComparison& rc, const GateOptions& o) {
  const ResultRow& cur = *rc.current;
  if (cur.mispredicted.empty()) {
    if (!cur.predictionsJudged) {
      rc.prediction = "not judged";  // a results file from before runs judged predictions
    } else if (cur.predictedMemBytes || cur.predictedTimeUs) {
      rc.prediction = "ok";
    }
    return;
  }
  rc.prediction = "mispredicted (" + cur.mispredicted + ")";
  std::string why = "prediction: " + cur.mispredicted + " mispredicted";
  const auto at = cur.message.find("mispredicted: ");
  if (at != std::string::npos) why += " (" + cur.message.substr(at + 14) + ")";
  (o.allowMispredicted ? rc.warnings : rc.gateFailures).push_back(why);
}

double cvOf(const ResultRow& r) {
  if (r.timeSamplesUs.size() >= 2) {
    const double m = mean(r.timeSamplesUs);
    return m > 0 ? stddev(r.timeSamplesUs) / m : 0;
  }
  if (r.timeMeanUs && r.timeStddevUs && *r.timeMeanUs > 0) return *r.timeStddevUs / *r.timeMeanUs;
  return 0;
}

void judgeTime(RowComparison& rc, const GateOptions& o) {
  const ResultRow& cur = *rc.current;
  const ResultRow& base = *rc.baseline;
  if (!cur.timeMedianUs || !base.timeMedianUs) return;
  const double cm = cur.timeSamplesUs.empty() ? *cur.timeMedianUs : median(cur.timeSamplesUs);
  const double bm = base.timeSamplesUs.empty() ? *base.timeMedianUs : median(base.timeSamplesUs);
  if (!(bm > 0) || !std::isfinite(cm)) return;
  const double change = (cm - bm) / bm * 100.0;
  rc.timeChangePct = change;
  rc.noisy = cvOf(cur) > o.noisyCv || cvOf(base) > o.noisyCv;
  if (std::abs(change) < o.perfThresholdPct) {
    rc.time = "unchanged";
    return;
  }
  const size_t nc = cur.timeSamplesUs.size(), nb = base.timeSamplesUs.size();
  if (nc < static_cast<size_t>(o.minSamples) || nb < static_cast<size_t>(o.minSamples)) {
    rc.time = "too few repetitions";
    rc.warnings.push_back("time: median moved " + pct(change) + " but there are only " +
                          std::to_string(nc) + " and " + std::to_string(nb) +
                          " repetitions (the U test needs " + std::to_string(o.minSamples) +
                          " a side)");
    return;
  }
  const MannWhitney mw = mannWhitneyU(cur.timeSamplesUs, base.timeSamplesUs);
  rc.timePValue = mw.pValue;
  if (mw.pValue >= o.alpha) {
    rc.time = "not significant";
    rc.noisy = true;
    return;
  }
  rc.time = change > 0 ? "regressed" : "improved";
  if (change > 0) {
    const std::string why = "time: median " + num(bm) + " -> " + num(cm) + " us (" + pct(change) +
                            ", past " + num(o.perfThresholdPct) +
                            "%), Mann-Whitney p = " + num(mw.pValue);
    (o.hardPerf ? rc.gateFailures : rc.warnings).push_back(why);
  }
}

void judgeMemory(RowComparison& rc, const GateOptions& o) {
  const ResultRow& cur = *rc.current;
  const ResultRow& base = *rc.baseline;
  if (!cur.peakMemBytes || !base.peakMemBytes || *base.peakMemBytes <= 0) return;
  const double change =
      (static_cast<double>(*cur.peakMemBytes) - static_cast<double>(*base.peakMemBytes)) /
      static_cast<double>(*base.peakMemBytes) * 100.0;
  rc.memChangePct = change;
  if (change > o.memThresholdPct) {
    rc.mem = "regressed";
    rc.gateFailures.push_back("memory: peak " + std::to_string(*base.peakMemBytes) + " -> " +
                              std::to_string(*cur.peakMemBytes) + " bytes (" + pct(change) +
                              ", past " + num(o.memThresholdPct) + "%)");
  } else if (change < -o.memThresholdPct) {
    rc.mem = "improved";
  } else {
    rc.mem = "unchanged";
  }
}

std::string suiteList(const std::set<std::string>& s) {
  std::string out;
  for (const auto& x : s) out += (out.empty() ? "" : ", ") + x;
  return out;
}

}  // namespace

const char* verdictName(Verdict v) {
  switch (v) {
    case Verdict::kRegressed:
      return "regressed";
    case Verdict::kImproved:
      return "improved";
    case Verdict::kUnchanged:
      return "unchanged";
    case Verdict::kNew:
      return "new";
    case Verdict::kGone:
      return "gone";
  }
  return "?";
}

bool Comparison::gateFailed() const {
  for (const auto& r : rows) {
    if (!r.gateFailures.empty()) return true;
  }
  return false;
}

std::vector<std::string> Comparison::gateFailures() const {
  std::vector<std::string> out;
  for (const auto& r : rows) {
    for (const auto& f : r.gateFailures) out.push_back(rowName(r.any()) + ": " + f);
  }
  return out;
}

std::vector<std::string> Comparison::warnings() const {
  std::vector<std::string> out;
  for (const auto& r : rows) {
    for (const auto& w : r.warnings) out.push_back(rowName(r.any()) + ": " + w);
  }
  return out;
}

Comparison compare(const std::vector<ResultRow>& current, const std::vector<ResultRow>& baseline,
                   const GateOptions& options) {
  Comparison cmp;
  cmp.hasBaseline = !baseline.empty();
  if (cmp.hasBaseline) {
    std::set<std::string> cs, bs;
    for (const auto& r : current) cs.insert(r.suite);
    for (const auto& r : baseline) bs.insert(r.suite);
    if (cs != bs) {
      throw ReportInputError(baseline.front().file + ": the baseline is from suite(s) " +
                             suiteList(bs) + " but the results are from suite(s) " + suiteList(cs) +
                             "; compare runs of the same suite");
    }
  }
  std::map<std::string, const ResultRow*> byKey;
  for (const auto& b : baseline) byKey.emplace(b.key(), &b);
  std::set<std::string> matched;

  for (const auto& c : current) {
    RowComparison rc;
    rc.current = &c;
    if (auto it = byKey.find(c.key()); it != byKey.end()) {
      rc.baseline = it->second;
      matched.insert(c.key());
    }
    judgeNumerics(rc);
    judgePrediction(rc, options);
    if (rc.baseline) {
      judgeTime(rc, options);
      judgeMemory(rc, options);
    }
    const bool regressed =
        rc.numerics == "regressed" || rc.time == "regressed" || rc.mem == "regressed";
    const bool improved = rc.numerics == "fixed" || rc.time == "improved" || rc.mem == "improved";
    if (cmp.hasBaseline && !rc.baseline) {
      rc.verdict = Verdict::kNew;
      rc.warnings.push_back("new: not in the baseline");
    } else if (regressed || rc.numerics == "new failure" ||
               (!rc.current->mispredicted.empty() && !options.allowMispredicted)) {
      rc.verdict = Verdict::kRegressed;
    } else if (improved) {
      rc.verdict = Verdict::kImproved;
    } else {
      rc.verdict = Verdict::kUnchanged;
    }
    cmp.rows.push_back(std::move(rc));
  }
  for (const auto& b : baseline) {
    if (matched.count(b.key())) continue;
    RowComparison rc;
    rc.baseline = &b;
    rc.verdict = Verdict::kGone;
    const std::string why = "gone: in the baseline (status " + b.status + ", " + b.where() +
                            ") but not in these results";
    (options.allowGone ? rc.warnings : rc.gateFailures).push_back(why);
    cmp.rows.push_back(std::move(rc));
  }
  return cmp;
}

}  // namespace sb::reports
