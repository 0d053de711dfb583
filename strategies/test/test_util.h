#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/case.h"
#include "harness/runner.h"

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
  const auto data = reference::findWorkload(c.workload)->build(c.shape, c.dtype, c.seed, c.inputs);
  return harness::runStrategy(c, data, s, harness::Provenance{}, harness::RunOptions{});
}

}  // namespace sb::strategies::test
