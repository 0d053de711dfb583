#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <c10/core/ScalarType.h>
#include <nlohmann/json.hpp>

#include "reference/training.h"
#include "reference/workload.h"

namespace sb::harness {

// One case of a suite: a workload instance on a mesh, and the strategies it selects.
struct CaseSpec {
  std::string suite;
  std::string name;
  std::string workload;  // a reference workload name, e.g. "linear"
  nlohmann::json shape;  // the workload's shape parameters
  at::ScalarType dtype = at::kFloat;
  std::string device = "cpu";
  std::vector<int64_t> mesh;  // e.g. {2, 2}
  std::string backend = "threads";
  uint64_t seed = 0;
  reference::InputMode inputs = reference::InputMode::kRandom;
  int repetitions = 10;
  double minTimeSec = 0.01;             // per repetition
  std::vector<std::string> strategies;  // ids or regular expressions (full match)
  // Strategy parameters of the case (e.g. {"budget": 0.5} for checkpointing), read by the
  // strategies that know them; a suite's `sweep` expands one case into one per value.
  nlohmann::json params = nlohmann::json::object();
  // `steps: N` and `optimizer: {...}`: N optimizer steps, checked per step and in the state
  // they leave (reference/training.h); not enabled: one forward and backward.
  reference::TrainingSpec training;
  std::string file;  // where the case was read from, for messages
  int line = 0;

  std::string where() const { return file + ":" + std::to_string(line); }
  int64_t meshSize() const;
  std::string meshString() const;
};

// "float32", "bfloat16", ... and back; parseDtype throws naming the value.
std::string dtypeName(at::ScalarType t);
at::ScalarType parseDtype(const std::string& name);

}  // namespace sb::harness
