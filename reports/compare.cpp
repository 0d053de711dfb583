#include "reports/compare.h"
#include "harness/in_file.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <utility>

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

// A row's median time: of its repetitions' samples where it has them, else as written; NaN
// for a row without a time.
double rowMedian(const ResultRow& r) {
  if (!r.timeSamplesUs.empty()) return median(r.timeSamplesUs);
  return r.timeMedianUs ? *r.timeMedianUs : std::nan("");
}

// The change of `cur`'s median against `base`'s, in %, and the U test's p (1 when either side
// has fewer than the minimum repetitions).
std::pair<double, double> changeOf(const ResultRow& cur, const ResultRow& base,
                                   const GateOptions& o) {
  const double cm = rowMedian(cur), bm = rowMedian(base);
  double p = 1;
  if (cur.timeSamplesUs.size() >= static_cast<size_t>(o.minSamples) &&
      base.timeSamplesUs.size() >= static_cast<size_t>(o.minSamples)) {
    p = mannWhitneyU(cur.timeSamplesUs, base.timeSamplesUs).pValue;
  }
  return {(cm - bm) / bm * 100.0, p};
}

void judgeTime(RowComparison& rc, const GateOptions& o, const ResultRow* rerun) {
  const ResultRow& cur = *rc.current;
  const ResultRow& base = *rc.baseline;
  if (!cur.timeMedianUs || !base.timeMedianUs) return;
  const double cm = rowMedian(cur), bm = rowMedian(base);
  if (!(bm > 0) || !std::isfinite(cm)) return;
  const double change = (cm - bm) / bm * 100.0;
  rc.timeChangePct = change;
  rc.noisy = cvOf(cur) > o.noisyCv || cvOf(base) > o.noisyCv;
  rc.time = "unchanged";
  rc.timeClass = "unchanged";
  const std::string moved = "time: median " + num(bm) + " -> " + num(cm) + " us (" + pct(change);

  // The band the change must pass: the row's measured noise, or the fixed threshold.
  double band = o.perfThresholdPct;
  std::string bandText = "the threshold " + num(band) + "% (no noise calibration)";
  if (o.noise) {
    const auto it = o.noise->byKey.find(cur.key());
    if (it == o.noise->byKey.end()) {
      // A row the calibration did not see (new, or failing then): judged as before there was
      // a noise file, and said so; never let through unjudged.
      bandText = "the threshold " + num(band) + "% (" + o.noise->file +
                 " has no band for this row: recalibrate, ci/nightly.sh --calibrate N)";
    } else {
      band = std::max(o.perfThresholdPct, it->second.bandPct);
      bandText = "its noise band " + num(band) + "% (" + num(it->second.spreadPct) +
                 "% spread over " + std::to_string(it->second.runs) + " runs of one build)";
    }
  }
  rc.timeBandPct = band;
  if (std::abs(change) < band) return;

  const size_t nc = cur.timeSamplesUs.size(), nb = base.timeSamplesUs.size();
  if (nc < static_cast<size_t>(o.minSamples) || nb < static_cast<size_t>(o.minSamples)) {
    rc.time = "too few repetitions";
    rc.timeClass = "insufficient data";
    rc.warnings.push_back(moved + ", past " + bandText + ") but there are only " +
                          std::to_string(nc) + " and " + std::to_string(nb) +
                          " repetitions (the U test needs " + std::to_string(o.minSamples) +
                          " a side)");
    return;
  }
  const MannWhitney mw = mannWhitneyU(cur.timeSamplesUs, base.timeSamplesUs);
  rc.timePValue = mw.pValue;
  const std::string why = moved + ", past " + bandText + "), Mann-Whitney p = " + num(mw.pValue);
  if (change > 0) {
    // A slower row is rerun (ci/nightly.sh): the rerun decides, where it measured (passed, a
    // finite median, enough repetitions for the U test). Past the band and significant again:
    // a regression. Past the band again, not significant: suspicious. Back inside the band: a
    // one-off stall of the machine, not a change of the build (said, not classed a finding).
    const bool usable = rerun && rerun->status == "pass" && rerun->timeMedianUs &&
                        std::isfinite(*rerun->timeMedianUs) &&
                        rerun->timeSamplesUs.size() >= static_cast<size_t>(o.minSamples);
    if (rerun && !usable) {
      rc.warnings.push_back("time: the rerun of this row measured nothing usable (status " +
                            rerun->status + ", " + std::to_string(rerun->timeSamplesUs.size()) +
                            " repetitions): the night's finding stands");
    }
    bool significant = mw.pValue < o.alpha;
    std::string rerunText;
    if (usable) {
      const auto [again, p] = changeOf(*rerun, base, o);
      rc.confirmChangePct = again;
      rerunText = "; a rerun measured " + pct(again) + " (p = " + num(p) + ")";
      if (!(again >= band)) {
        rc.time = "not reproduced";
        rc.warnings.push_back("not reproduced: " + why + rerunText +
                              ", inside the band: a one-off stall, not a change");
        return;
      }
      significant = p < o.alpha;
    }
    if (!significant) {
      rc.time = "not significant";
      rc.timeClass = "suspicious";
      rc.noisy = true;
      rc.warnings.push_back("suspicious " + why + rerunText +
                            ": past the band, but the U test "
                            "is not below " +
                            num(o.alpha));
      return;
    }
    rc.time = "regressed";
    rc.timeClass = "regression";
    (o.hardPerf ? rc.gateFailures : rc.warnings)
        .push_back(why + (usable ? rerunText + ": reproduced" : std::string()));
    return;
  }
  if (mw.pValue >= o.alpha) {
    rc.time = "not significant";
    rc.timeClass = "suspicious";
    rc.noisy = true;
    rc.warnings.push_back("suspicious " + why + ": past the band, but the U test is not below " +
                          num(o.alpha));
    return;
  }
  rc.time = "improved";
  rc.timeClass = "improvement";
  if (-change >= std::max(2 * band, o.largeImprovementPct)) {
    rc.largeImprovement = true;
    rc.warnings.push_back("unexplained large improvement: " + why +
                          ": check that the strategy still does its work before promoting");
  }
}

void judgeMemory(RowComparison& rc, const GateOptions& o) {
  const ResultRow& cur = *rc.current;
  const ResultRow& base = *rc.baseline;
  if (!cur.peakMemBytes || !base.peakMemBytes || *base.peakMemBytes < 0) return;
  if (*base.peakMemBytes == 0) {
    // Growth from nothing has no percentage, and is past any threshold: a strategy that
    // allocated nothing now allocates. Only where both rows ran their step (an erroring row's
    // peak is whatever it reached before the error).
    if (cur.status != "pass" || base.status != "pass") return;
    if (*cur.peakMemBytes > 0) {
      rc.mem = "regressed";
      rc.gateFailures.push_back("memory: peak 0 -> " + std::to_string(*cur.peakMemBytes) +
                                " bytes (the baseline allocated nothing)");
    } else {
      rc.mem = "unchanged";
    }
    return;
  }
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

std::string noiseJson(const std::vector<std::vector<ResultRow>>& runs,
                      const std::vector<std::string>& runDirs, double floorPct, double factor) {
  std::map<std::string, std::vector<double>> medians;
  std::map<std::string, const ResultRow*> first;
  std::set<std::string> shas, hosts, suites;
  for (const auto& run : runs) {
    for (const auto& r : run) {
      shas.insert(r.gitSha);
      hosts.insert(r.host);
      suites.insert(r.suite);
      const double m = rowMedian(r);
      if (r.status != "pass" || !std::isfinite(m) || !(m > 0)) continue;
      medians[r.key()].push_back(m);
      first.emplace(r.key(), &r);
    }
  }
  // A row's own spread over a handful of runs understates its noise as often as not (three
  // draws can land close by chance). So each row's spread is pooled with the typical spread of
  // the rows of its time scale (the decade of its median: 100 us rows share their noise, 10 ms
  // rows theirs; the median over those rows), weighted as one run against the row's own n - 1:
  // sqrt(((n - 1) own^2 + scale^2) / n). The band is `factor` times that.
  struct Row {
    double mid, spread;
  };
  std::map<std::string, Row> own;
  std::map<int, std::vector<double>> byDecade;
  const auto decadeOf = [](double us) { return static_cast<int>(std::floor(std::log10(us))); };
  for (const auto& [key, ms] : medians) {
    if (ms.size() < 2) continue;  // one run says nothing about the spread
    const double mid = median(ms);
    const auto [lo, hi] = std::minmax_element(ms.begin(), ms.end());
    own[key] = {mid, (*hi - *lo) / mid * 100.0};
    byDecade[decadeOf(mid)].push_back(own[key].spread);
  }
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& [key, ms] : medians) {
    if (!own.count(key)) continue;
    const Row& o = own.at(key);
    const auto& peers = byDecade.at(decadeOf(o.mid));
    // The typical spread of the time scale: the median over at least three rows, else none.
    const double pooled = peers.size() >= 3 ? median(peers) : 0.0;
    const ResultRow& r = *first.at(key);
    const double n = static_cast<double>(ms.size());
    const double pooledSpread = std::sqrt(((n - 1) * o.spread * o.spread + pooled * pooled) / n);
    rows.push_back({{"suite", r.suite},
                    {"case", r.caseName},
                    {"strategy_id", r.strategyId},
                    {"backend", r.backend},
                    {"medians_us", ms},
                    {"spread_pct", o.spread},
                    {"scale_spread_pct", pooled},
                    {"pooled_spread_pct", pooledSpread},
                    {"band_pct", std::max(floorPct, factor * pooledSpread)}});
  }
  nlohmann::json j = {{"schema_version", 1},
                      {"what",
                       "stratbench noise: the spread of each row's median time over runs "
                       "of one build on one machine; band = max(floor, factor x "
                       "sqrt(((n - 1) spread^2 + scale_spread^2) / n)), scale_spread the "
                       "median spread of the rows of its decade of time"},
                      {"runs", runDirs},
                      {"git_sha", suiteList(shas)},
                      {"host", suiteList(hosts)},
                      {"suites", suiteList(suites)},
                      {"floor_pct", floorPct},
                      {"factor", factor},
                      {"rows", rows}};
  return j.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

NoiseModel readNoise(const std::string& path) {
  if (const auto why = harness::notARegularFile(path); !why.empty()) {
    throw ReportInputError(path + ": " + why);
  }
  std::ifstream in(path);
  if (!in)
    throw ReportInputError(path + ": no such noise file (write one with `stratbench noise`)");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw ReportInputError(path + ": not JSON: " + e.what());
  }
  const auto need = [&](const nlohmann::json& o, const char* key, const std::string& where,
                        bool number) -> const nlohmann::json& {
    if (!o.is_object() || !o.contains(key)) {
      throw ReportInputError(path + ": " + where + "lacks key '" + key + "'");
    }
    const auto& v = o.at(key);
    if (number ? !v.is_number() : !v.is_string()) {
      throw ReportInputError(path + ": " + where + "key '" + key + "' is " + v.dump() +
                             ", expected " + (number ? "a number" : "a string"));
    }
    return v;
  };
  // The other JSON a run is given (calibrate's cost profile, --cost-profile) named as such, not
  // as a noise file that "lacks key 'floor_pct'".
  if (j.is_object() && !j.contains("floor_pct") && j.contains("backend") &&
      (j.contains("gemm_flops") || j.contains("copy_bytes") || j.contains("collectives"))) {
    throw ReportInputError(path +
                           ": a cost profile (`stratbench calibrate` writes it; `run "
                           "--cost-profile` takes it), not a noise file (`stratbench noise` "
                           "writes one from repeated runs)");
  }
  if (!j.is_object() || !j.contains("schema_version") || j["schema_version"] != 1) {
    throw ReportInputError(path + ": schema_version " +
                           (j.is_object() && j.contains("schema_version")
                                ? j["schema_version"].dump()
                                : std::string("missing")) +
                           ", expected 1 (a noise file `stratbench noise` writes)");
  }
  NoiseModel m;
  m.file = path;
  m.floorPct = need(j, "floor_pct", "", true).get<double>();
  m.factor = need(j, "factor", "", true).get<double>();
  if (!(m.floorPct >= 0 && m.floorPct < 1e6) || !(m.factor > 0 && m.factor < 1e6)) {
    throw ReportInputError(path + ": floor_pct must be in [0, 1e6) and factor in (0, 1e6), got " +
                           j["floor_pct"].dump() + " and " + j["factor"].dump());
  }
  m.gitSha = need(j, "git_sha", "", false).get<std::string>();
  m.host = need(j, "host", "", false).get<std::string>();
  if (!j.contains("runs") || !j["runs"].is_array()) {
    throw ReportInputError(path + ": key 'runs' must be a list of run folders");
  }
  m.runs = static_cast<int>(j["runs"].size());
  if (!j.contains("rows") || !j["rows"].is_array()) {
    throw ReportInputError(path + ": key 'rows' must be a list");
  }
  int i = 0;
  for (const auto& r : j["rows"]) {
    const std::string where = "rows[" + std::to_string(i++) + "] ";
    ResultRow key;
    key.suite = need(r, "suite", where, false).get<std::string>();
    key.caseName = need(r, "case", where, false).get<std::string>();
    key.strategyId = need(r, "strategy_id", where, false).get<std::string>();
    key.backend = need(r, "backend", where, false).get<std::string>();
    NoiseBand b;
    b.bandPct = need(r, "band_pct", where, true).get<double>();
    b.spreadPct = need(r, "spread_pct", where, true).get<double>();
    if (!(b.bandPct >= 0 && b.bandPct < 1e6) || !(b.spreadPct >= 0 && b.spreadPct < 1e6)) {
      throw ReportInputError(path + ": " + where + "band_pct/spread_pct must be in [0, 1e6)");
    }
    b.runs = r.contains("medians_us") && r["medians_us"].is_array()
                 ? static_cast<int>(r["medians_us"].size())
                 : m.runs;
    // A row given twice would silently take the last band: the noise of one key is one
    // measurement, so a second is an edited or merged file.
    if (!m.byKey.emplace(key.key(), b).second) {
      throw ReportInputError(path + ": " + where + "repeats suite '" + key.suite + "' case '" +
                             key.caseName + "' strategy '" + key.strategyId + "' backend '" +
                             key.backend + "' (one row a key, as `stratbench noise` writes)");
    }
  }
  return m;
}

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
  if (!runFailures.empty()) return true;
  for (const auto& r : rows) {
    if (!r.gateFailures.empty()) return true;
  }
  return false;
}

std::vector<std::string> Comparison::promotionBlockers() const {
  std::vector<std::string> out = gateFailures();
  for (const auto& r : rows) {
    if (r.timeClass == "regression" && r.gateFailures.empty()) {
      out.push_back(rowName(r.any()) +
                    ": a time regression (soft in the gate, but a slower "
                    "night is no baseline)");
    }
  }
  return out;
}

std::vector<std::string> Comparison::gateFailures() const {
  std::vector<std::string> out = runFailures;
  for (const auto& r : rows) {
    for (const auto& f : r.gateFailures) out.push_back(rowName(r.any()) + ": " + f);
  }
  return out;
}

std::vector<std::string> Comparison::warnings() const {
  std::vector<std::string> out = runWarnings;
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
  // The run as a whole: interrupted, or a suite that ran nothing.
  std::map<std::string, int> partialRows;
  for (const auto& r : current) {
    if (r.partial) partialRows[r.file]++;
  }
  for (const auto& [file, n] : partialRows) {
    cmp.partial = true;
    cmp.runFailures.push_back("partial results: " + file + " holds " + std::to_string(n) +
                              " row(s) of a run that was interrupted (or still goes on); the "
                              "rows it did not reach are missing");
  }
  std::map<std::string, std::map<std::string, int>> bySuite;  // suite -> status -> rows
  std::map<std::string, std::map<std::string, int>> whyNot;   // suite -> reason -> rows
  for (const auto& r : current) {
    bySuite[r.suite][r.status]++;
    if (r.status == "skipped" || r.status == "unsupported") {
      whyNot[r.suite][r.status + ": " + (r.message.empty() ? "(no reason given)" : r.message)]++;
    }
  }
  for (const auto& [suite, byStatus] : bySuite) {
    // (A lambda captures a structured binding only from C++20: clang 14 refuses it.)
    const auto& counts = byStatus;
    const auto n = [&](const char* s) { return counts.count(s) ? counts.at(s) : 0; };
    if (n("pass") + n("fail") + n("error") > 0) continue;
    std::string why = "suite " + suite + " ran nothing: " + std::to_string(n("skipped")) +
                      " row(s) skipped, " + std::to_string(n("unsupported")) + " unsupported";
    int shown = 0;
    for (const auto& [reason, k] : whyNot[suite]) {
      if (shown++ == 3) {
        why += "; ...";
        break;
      }
      why += "; " + std::to_string(k) + " x " + reason;
    }
    (options.allowEmptySuite ? cmp.runWarnings : cmp.runFailures)
        .push_back(why + (options.allowEmptySuite ? " (--allow-empty-suite)" : ""));
  }

  // A confirming run is a later run of the rows judged: the baseline itself "confirmed" a
  // regression away (its times are the baseline's), and another suite's rows confirm nothing.
  if (!options.confirm.empty()) {
    std::set<std::string> baseRuns, currentRuns, currentSuites;
    for (const auto& b : baseline) baseRuns.insert(b.runId);
    for (const auto& c : current) {
      currentRuns.insert(c.runId);
      currentSuites.insert(c.suite);
    }
    for (const auto& r : options.confirm) {
      if (baseRuns.count(r.runId)) {
        throw ReportInputError("--confirm: run " + r.runId +
                               " is a baseline run; a rerun that "
                               "confirms a regression is a run made after the one judged");
      }
      if (currentRuns.count(r.runId)) {
        throw ReportInputError("--confirm: run " + r.runId +
                               " is the run being judged; give a "
                               "rerun made after it");
      }
      if (!currentSuites.count(r.suite)) {
        throw ReportInputError("--confirm: its rows are of suite '" + r.suite +
                               "', which the results judged do not hold");
      }
    }
  }
  std::map<std::string, const ResultRow*> byKey, rerunOf;
  for (const auto& b : baseline) byKey.emplace(b.key(), &b);
  for (const auto& r : options.confirm) rerunOf.emplace(r.key(), &r);
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
      const auto rr = rerunOf.find(c.key());
      judgeTime(rc, options, rr == rerunOf.end() ? nullptr : rr->second);
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
  std::set<std::string> curBackends, curCases;
  for (const auto& c : current) {
    curBackends.insert(c.backend);
    curCases.insert(c.suite + "\x1f" + c.caseName + "\x1f" + c.backend);
  }
  for (const auto& b : baseline) {
    if (matched.count(b.key())) continue;
    RowComparison rc;
    rc.baseline = &b;
    rc.verdict = Verdict::kGone;
    std::string because;
    if (!curBackends.count(b.backend)) {
      because = "this run used backend " + suiteList(curBackends) + ", the baseline " + b.backend +
                ": compare runs of the same backend";
    } else if (cmp.partial) {
      because = "the run was interrupted before it (partial results)";
    } else if (!curCases.count(b.suite + "\x1f" + b.caseName + "\x1f" + b.backend)) {
      because = "its case did not run (a --case filter, or the case left the suite)";
    } else {
      because =
          "its case ran without this strategy (a --filter, or the strategy was renamed or "
          "removed)";
    }
    const std::string why = "gone: in the baseline (status " + b.status + ", " + b.where() +
                            ") but not in these results: " + because;
    (options.allowGone ? rc.warnings : rc.gateFailures).push_back(why);
    cmp.rows.push_back(std::move(rc));
  }
  return cmp;
}

}  // namespace sb::reports
