// The JSON codec of a rank's outcome (see rank_outcome.h).

#include "harness/run/rank_outcome.h"

#include <cmath>

namespace sb::harness {
namespace {

nlohmann::json finiteOrText(double x) {
  return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(std::to_string(x));
}
double numberOrText(const nlohmann::json& j) {
  return j.is_string() ? std::stod(j.get<std::string>()) : j.get<double>();
}

}  // namespace

nlohmann::json checkToJson(const TensorCheck& c) {
  nlohmann::json j;
  j["tensor"] = c.tensor;
  j["rank"] = c.rank;
  j["numel"] = c.numel;
  j["mismatches"] = c.mismatches;
  j["max_abs_err"] = finiteOrText(c.maxAbsErr);
  j["max_rel_err"] = finiteOrText(c.maxRelErr);
  j["err_ratio"] = finiteOrText(c.errRatio);
  j["worst_index"] = c.worstIndex;
  j["worst_actual"] = finiteOrText(c.worstActual);
  j["worst_expected"] = finiteOrText(c.worstExpected);
  j["tolerance"] = c.tolerance;
  if (!c.problem.empty()) j["problem"] = c.problem;
  return j;
}

TensorCheck checkFromJson(const nlohmann::json& j) {
  TensorCheck c;
  c.tensor = j.at("tensor").get<std::string>();
  c.rank = j.at("rank").get<int>();
  c.numel = j.at("numel").get<int64_t>();
  c.mismatches = j.at("mismatches").get<int64_t>();
  c.maxAbsErr = numberOrText(j.at("max_abs_err"));
  c.maxRelErr = numberOrText(j.at("max_rel_err"));
  c.errRatio = numberOrText(j.at("err_ratio"));
  c.worstIndex = j.at("worst_index").get<std::vector<int64_t>>();
  c.worstActual = numberOrText(j.at("worst_actual"));
  c.worstExpected = numberOrText(j.at("worst_expected"));
  c.tolerance = j.at("tolerance").get<std::string>();
  c.problem = j.value("problem", "");
  return c;
}

nlohmann::json commToJson(const CommStats& s) {
  nlohmann::json j = nlohmann::json::object();
  for (int i = 0; i < kNumCollectives; ++i) {
    if (s.entries[i].calls == 0) continue;
    j[collectiveName(static_cast<Collective>(i))] = {{"calls", s.entries[i].calls},
                                                     {"bytes", s.entries[i].bytes}};
  }
  return j;
}

CommStats commFromJson(const nlohmann::json& j) {
  CommStats s;
  for (int i = 0; i < kNumCollectives; ++i) {
    const char* name = collectiveName(static_cast<Collective>(i));
    if (!j.contains(name)) continue;
    s.entries[i].calls = j.at(name).at("calls").get<int64_t>();
    s.entries[i].bytes = j.at(name).at("bytes").get<int64_t>();
  }
  return s;
}

nlohmann::json nodeCommToJson(const std::vector<NodeComm>& nodes) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& n : nodes) {
    j.push_back({{"node", n.node}, {"phase", n.phase}, {"comm", commToJson(n.comm)}});
  }
  return j;
}

std::vector<NodeComm> nodeCommFromJson(const nlohmann::json& j) {
  std::vector<NodeComm> out;
  for (const auto& e : j) {
    out.push_back({e.at("node").get<std::string>(), e.at("phase").get<std::string>(),
                   commFromJson(e.at("comm"))});
  }
  return out;
}

nlohmann::json outcomeToJson(const RankOutcome& o) {
  nlohmann::json j;
  j["rank"] = o.rank;
  j["unsupported"] = o.unsupported;
  j["error"] = o.error;
  j["error_at_ms"] = o.errorAtMs;
  j["peak"] = o.peak;
  j["start_bytes"] = o.startBytes;
  j["end_bytes"] = o.endBytes;
  j["timed_steps"] = o.timedSteps;
  j["after_first_timed_bytes"] = o.afterFirstTimedBytes;
  j["after_last_timed_bytes"] = o.afterLastTimedBytes;
  j["counted"] = commToJson(o.counted);
  j["counted_by_node"] = nodeCommToJson(o.counted.byNode);
  j["wire"] = commToJson(o.wire);
  if (o.predictedPeak) j["predicted_peak"] = *o.predictedPeak;
  if (o.memoryLimit) j["memory_limit"] = *o.memoryLimit;
  nlohmann::json checks = nlohmann::json::array(), after = nlohmann::json::array();
  for (const auto& c : o.checks) checks.push_back(checkToJson(c));
  for (const auto& c : o.checksAfter) after.push_back(checkToJson(c));
  j["checks"] = checks;
  j["checks_after"] = after;
  j["digests"] = o.digests;
  if (!o.divergence.is_null()) j["divergence"] = o.divergence;
  return j;
}

RankOutcome outcomeFromJson(const nlohmann::json& j) {
  RankOutcome o;
  o.rank = j.at("rank").get<int>();
  o.unsupported = j.at("unsupported").get<std::string>();
  o.error = j.at("error").get<std::string>();
  o.errorAtMs = j.at("error_at_ms").get<int64_t>();
  o.peak = j.at("peak").get<int64_t>();
  o.startBytes = j.value("start_bytes", int64_t{0});
  o.endBytes = j.value("end_bytes", int64_t{-1});
  o.timedSteps = j.value("timed_steps", int64_t{0});
  o.afterFirstTimedBytes = j.value("after_first_timed_bytes", int64_t{0});
  o.afterLastTimedBytes = j.value("after_last_timed_bytes", int64_t{0});
  o.counted = commFromJson(j.at("counted"));
  o.counted.byNode = nodeCommFromJson(j.at("counted_by_node"));
  o.wire = commFromJson(j.at("wire"));
  if (j.contains("predicted_peak")) o.predictedPeak = j.at("predicted_peak").get<int64_t>();
  if (j.contains("memory_limit")) o.memoryLimit = j.at("memory_limit").get<int64_t>();
  for (const auto& c : j.at("checks")) o.checks.push_back(checkFromJson(c));
  for (const auto& c : j.at("checks_after")) o.checksAfter.push_back(checkFromJson(c));
  if (j.contains("digests")) o.digests = j.at("digests").get<std::map<std::string, std::string>>();
  if (j.contains("divergence")) o.divergence = j.at("divergence");
  return o;
}

}  // namespace sb::harness
