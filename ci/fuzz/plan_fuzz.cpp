// libFuzzer target: the sharding-plan reader (strategies/sharding/auto/model.h,
// ShardingPlan::fromJson: `run` with params.plan, the plan files `solve shard` writes). Any JSON
// is a plan of the model or an InputError naming the key; a plan it accepts gives every node one
// of its own candidates, and its predicted step and peak are finite and non-negative.

#include <cmath>
#include <cstdint>

#include <nlohmann/json.hpp>

#include "harness/run/suite.h"
#include "reference/graph.h"
#include "strategies/sharding/auto/model.h"

namespace {

using sb::strategies::autoshard::ShardingModel;

// One small GPT-2 block on a 2x2 mesh, as ci/fuzz/corpus/plan's plans were solved for.
const ShardingModel& model() {
  static const ShardingModel m(
      sb::reference::buildGraph(
          "gpt2",
          {{"batch", 2}, {"seq", 4}, {"d_model", 8}, {"heads", 2}, {"layers", 1}, {"vocab", 16}}),
      {2, 2}, {});
  return m;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const nlohmann::json j =
      nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  const ShardingModel& m = model();
  try {
    const auto plan = sb::strategies::autoshard::ShardingPlan::fromJson(j, m, "fuzz.json");
    if (plan.choice.size() != m.graph().nodes.size()) __builtin_trap();
    for (size_t v = 0; v < plan.choice.size(); ++v) {
      const int k = plan.choice[v];
      if (k < 0 || k >= static_cast<int>(m.candidates(static_cast<int>(v)).size()))
        __builtin_trap();
    }
    const double us = m.stepUs(plan.choice);
    const int64_t peak = m.peakBytes(plan.choice);
    if (!std::isfinite(us) || us < 0 || peak < 0) __builtin_trap();
  } catch (const sb::harness::InputError&) {
  }
  return 0;
}
