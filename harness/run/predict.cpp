// A row's predictions and their verdict (see predict.h).

#include "harness/run/predict.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <limits>
#include <optional>
#include <sstream>
#include <vector>

namespace sb::harness {

const CostProfile* profileFor(const RunOptions& options, const CaseSpec& c) {
  for (const auto& p : options.costProfiles) {
    if (p.backend == options.backend && p.mesh == c.meshString()) return &p;
  }
  return nullptr;
}

void predictTime(Record& rec, const CaseSpec& c, const Strategy& strategy, int n,
                 const CostProfile& profile) {
  double worst = -1, computeUs = 0, commUs = 0, localUs = 0;
  const double overheadUs = profile.stepUs.value_or(0.0);
  for (int r = 0; r < n; ++r) {
    const std::optional<double> flops = strategy.predictFlops(c, r);
    if (!flops) return;
    double comm = 0;
    for (const auto& [axes, stats] : strategy.predictCommByGroup(c, r)) {
      const std::optional<double> us = profile.commUs(axes, stats);
      if (!us) return;  // a collective the profile did not measure
      comm += *us;
    }
    // A strategy with no matmuls (a redistribution) models zero flops.
    const double compute =
        *flops > 0 ? 3 * profile.gemm.latencyUs + profile.gemm.usPerByte * *flops : 0.0;
    double local = 0;
    if (const auto work = strategy.predictLocalWork(c, r)) {
      const std::optional<double> us = profile.localUs(*work);
      if (!us) return;  // an older profile without the copy fit
      local = *us;
    }
    if (overheadUs + compute + comm + local > worst) {
      worst = overheadUs + compute + comm + local;
      computeUs = compute;
      commUs = comm;
      localUs = local;
    }
  }
  rec.predictedTimeUs = worst;
  rec.details["predicted_time"] = {{"step_overhead_us", overheadUs},
                                   {"compute_us", computeUs},
                                   {"comm_us", commUs},
                                   {"local_us", localUs},
                                   {"profile", profile.backend + " " + profile.mesh + " on " +
                                                   profile.host + " at " + profile.timestampUtc}};
}

bool validPredictionName(const std::string& name) {
  if (name.empty() || name.size() > 64 || !(name[0] >= 'a' && name[0] <= 'z')) return false;
  for (char ch : name) {
    if (!((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_')) return false;
  }
  for (const char* word : {"false", "true", "no", "yes", "none", "null"}) {
    if (name == word) return false;
  }
  return true;
}

std::string judgePredictions(Record& rec, const Strategy::PredictionTolerance& tol) {
  nlohmann::json j = nlohmann::json::object();
  std::vector<std::string> flagged, why;
  // `about`: what the claim is, in the message beside its name (an executor's own claims).
  const auto judge = [&](const char* what, const char* unit, double measured, double predicted,
                         const std::optional<double>& tolerance, const std::string& about = "") {
    const double err = measured != 0
                           ? std::abs(measured - predicted) / std::abs(measured)
                           : (predicted == 0 ? 0.0 : std::numeric_limits<double>::infinity());
    j[what] = {{"measured", measured},
               {"predicted", predicted},
               {"relative_error", std::isfinite(err) ? nlohmann::json(err)
                                  : std::isnan(err)  ? nlohmann::json("nan")
                                                     : nlohmann::json("inf")},
               {"tolerance", tolerance ? nlohmann::json(*tolerance) : nlohmann::json("none")}};
    if (tolerance && !(err <= *tolerance)) {
      flagged.push_back(what);
      // Bytes as integers; the error with the digits that show it past the claim.
      std::ostringstream s;
      s << what << (about.empty() ? "" : " (" + about + ")") << " measured " << std::fixed
        << std::setprecision(unit[0] == 'b' ? 0 : 1) << measured << " " << unit << ", predicted "
        << predicted << " " << unit << " (" << std::defaultfloat << std::setprecision(6)
        << 100 * err << "% off; the strategy claims " << 100 * *tolerance << "%)";
      why.push_back(s.str());
    }
  };
  if (rec.peakMemBytes && rec.predictedMemBytes) {
    // Every rank against its own prediction where each has one (ranks differ: a causal ring's
    // skip different blocks), judged by the rank furthest off; else the largest against the
    // largest.
    double measured = static_cast<double>(*rec.peakMemBytes);
    double predicted = static_cast<double>(*rec.predictedMemBytes);
    int worst = -1;
    const auto& d = rec.details;
    if (d.contains("predicted_peak_mem_bytes_per_rank") && d.contains("peak_mem_bytes_per_rank") &&
        d["predicted_peak_mem_bytes_per_rank"].size() == d["peak_mem_bytes_per_rank"].size()) {
      double worstErr = -1;
      for (size_t r = 0; r < d["peak_mem_bytes_per_rank"].size(); ++r) {
        const double m = d["peak_mem_bytes_per_rank"][r].get<double>();
        const double p = d["predicted_peak_mem_bytes_per_rank"][r].get<double>();
        const double err = m != 0 ? std::abs(m - p) / m : (p == 0 ? 0.0 : 1e300);
        if (err > worstErr) {
          worstErr = err;
          worst = static_cast<int>(r);
          measured = m;
          predicted = p;
        }
      }
    }
    judge("memory", "bytes", measured, predicted, tol.memory);
    if (worst >= 0) j["memory"]["worst_rank"] = worst;
  }
  if (rec.timing && rec.predictedTimeUs) {
    judge("time", "us", rec.timing->medianUs, *rec.predictedTimeUs, tol.time);
  }
  // An executor's own predictions (a pipeline's bubble), each with the claim its strategy makes:
  // details.executor.predictions[] = {what, unit, measured, predicted, tolerance, floor, about}:
  // `what` a lower-case name (the mispredicted column's), `about` the claim in words. Off
  // where |measured - predicted| is over tolerance x |measured| and over `floor` (an absolute
  // error the claim allows whatever the measurement, where a quantity can be near zero).
  if (rec.details.contains("executor") && rec.details["executor"].contains("predictions")) {
    for (const auto& p : rec.details["executor"]["predictions"]) {
      const std::string what = p.at("what"), unit = p.at("unit");
      // A name the results file cannot carry (or one already judged: the runner's memory and
      // time, an executor's twice) is the executor's mistake, flagged as such: the column stays
      // one every reader takes, and the row is off (a claim nobody can read is not kept).
      if (!validPredictionName(what) || what == "memory" || what == "time" ||
          what == "malformed_prediction" || j.contains(what)) {
        const std::string bad = "malformed_prediction";
        if (std::find(flagged.begin(), flagged.end(), bad) == flagged.end()) {
          flagged.push_back(bad);
          why.push_back("the executor's prediction named '" + what.substr(0, 64) +
                        "' is not one the results can carry (a lower-case name, a-z 0-9 _, "
                        "not a yes/no word, each once, not the runner's memory or time)");
        }
        continue;
      }
      const double measured = p.at("measured"), predicted = p.at("predicted");
      const double floor = p.value("floor", 0.0);
      // The claim as a relative tolerance against this measurement, the floor folded in (a
      // measurement of 0: within the floor or not at all).
      const double off = std::abs(measured - predicted);
      const double tolerance =
          measured != 0 ? std::max(p.at("tolerance").get<double>(), floor / std::abs(measured))
                        : (off <= floor ? std::numeric_limits<double>::infinity() : 0.0);
      judge(what.c_str(), unit.c_str(), measured, predicted, tolerance, p.value("about", ""));
    }
  }
  if (!j.empty()) rec.details["prediction"] = j;
  std::string flags, text;
  for (size_t i = 0; i < flagged.size(); ++i) {
    flags += (i ? "+" : "") + flagged[i];
    text += (i ? "; " : "") + why[i];
  }
  rec.mispredicted = flags;
  return text.empty() ? "" : "mispredicted: " + text;
}

}  // namespace sb::harness
