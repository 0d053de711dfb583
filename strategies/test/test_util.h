#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/case.h"
#include "harness/registry.h"
#include "harness/run/runner.h"

namespace sb::strategies::test {

// A Linear case with quick timing (one short repetition): tests check numerics and counts,
// not speed.
inline harness::CaseSpec linearCase(std::vector<int64_t> input, int64_t out,
                                    std::vector<int64_t> mesh, bool exact = false) {
  harness::CaseSpec c;
  c.suite = "test";
  c.name = "test";
  c.workload = "linear";
  c.shape = {{"input", input}, {"out_features", out}, {"bias", true}};
  c.mesh = std::move(mesh);
  c.seed = 7;
  c.inputs = exact ? reference::InputMode::kExact : reference::InputMode::kRandom;
  c.repetitions = 1;
  c.minTimeSec = 1e-4;
  c.file = "test";
  return c;
}

// A single-operator case (workload op) with quick timing.
inline harness::CaseSpec opCase(nlohmann::json shape, std::vector<int64_t> mesh,
                                bool exact = false) {
  harness::CaseSpec c = linearCase({}, 0, std::move(mesh), exact);
  c.workload = "op";
  c.shape = std::move(shape);
  c.seed = 11;
  return c;
}

inline harness::Record run(const harness::CaseSpec& c, const harness::Strategy& s) {
  const auto data =
      c.training.enabled()
          ? reference::buildTraining(c.workload, c.shape, c.dtype, c.seed, c.inputs, c.training)
          : reference::findWorkload(c.workload)->build(c.shape, c.dtype, c.seed, c.inputs);
  return harness::runStrategy(c, data, s, harness::Provenance{}, harness::RunOptions{});
}

// A registered strategy by id; throws if there is none.
inline const harness::Strategy& strategy(const std::string& id) {
  const harness::Strategy* s = harness::StrategyRegistry::global().find(id);
  if (!s) throw std::runtime_error("no strategy " + id);
  return *s;
}

// A record's parameter by name ("" if it has none).
inline std::string param(const harness::Record& r, const std::string& key) {
  for (const auto& [k, v] : r.params) {
    if (k == key) return v;
  }
  return "";
}

}  // namespace sb::strategies::test
