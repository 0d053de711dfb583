// The Linear family's shared names: its planted faults (for ShardedTensor's strategies too) and
// the logical strategies of ColossalAI's Linear generator (linear_strategies.h).

#include <ATen/ATen.h>

#include "strategies/sharding/linear/linear_strategies.h"

namespace sb::strategies {

const char* plantedFaultName(PlantedFault f) {
  switch (f) {
    case PlantedFault::kNone:
      return "none";
    case PlantedFault::kSkipForwardAllReduce:
      return "skip_forward_all_reduce";
    case PlantedFault::kShardOffsetOffByOne:
      return "shard_offset_off_by_one";
    case PlantedFault::kIgnorePlacements:
      return "ignore_placements";
    case PlantedFault::kConsistentWrongLayout:
      return "consistent_wrong_layout";
  }
  TORCH_INTERNAL_ASSERT(false, "unknown planted fault");
}

std::optional<PlantedFault> parsePlantedFault(const std::string& name,
                                              const std::vector<PlantedFault>& supported) {
  for (PlantedFault f : supported) {
    if (name == plantedFaultName(f)) return f;
  }
  return std::nullopt;
}

std::vector<std::string> plantedFaultNames(const std::vector<PlantedFault>& faults) {
  std::vector<std::string> names;
  for (PlantedFault f : faults) names.emplace_back(plantedFaultName(f));
  return names;
}

std::vector<LinearMeshSpec> linearMeshSpecs() {
  const std::vector<int> twoD = {2};
  const std::vector<int> both = {1, 2};
  std::vector<LinearMeshSpec> specs;
  // The order of ColossalAI's LinearProjectionStrategyGenerator.collate_strategies.
  for (auto [a, b] : {std::pair{0, 1}, std::pair{1, 0}}) {  // SS = SR x RS
    const std::string A = std::to_string(a), B = std::to_string(b);
    specs.push_back({"S" + A + "S" + B + " = S" + A + "R x RS" + B, {a}, {}, {b}, twoD});
  }
  for (auto [a, b] : {std::pair{0, 1}, std::pair{1, 0}}) {  // SR = SS x SR
    const std::string A = std::to_string(a), B = std::to_string(b);
    specs.push_back({"S" + A + "R = S" + A + "S" + B + " x S" + B + "R", {a}, {b}, {}, twoD});
  }
  for (auto [a, b] : {std::pair{0, 1}, std::pair{1, 0}}) {  // RS = RS x SS
    const std::string A = std::to_string(a), B = std::to_string(b);
    specs.push_back({"RS" + B + " = RS" + A + " x S" + A + "S" + B, {}, {a}, {b}, twoD});
  }
  for (int a : {0, 1}) {  // RR = RS x SR
    const std::string A = std::to_string(a);
    specs.push_back({"RR = RS" + A + " x S" + A + "R", {}, {a}, {}, a == 0 ? both : twoD});
  }
  for (int a : {0, 1}) {  // RS = RR x RS
    const std::string A = std::to_string(a);
    specs.push_back({"RS" + A + " = RR x RS" + A, {}, {}, {a}, a == 0 ? both : twoD});
  }
  specs.push_back({"S01R = S01R x RR", {0, 1}, {}, {}, twoD});
  specs.push_back({"RR = RS01 x S01R", {}, {0, 1}, {}, twoD});
  specs.push_back({"RS01 = RR x RS01", {}, {}, {0, 1}, twoD});
  specs.push_back({"RR = RR x RR", {}, {}, {}, both});
  // 1-D mesh only: plain data parallelism (the 2-D generator splits the batch over both axes
  // or pairs it with another split instead).
  specs.push_back({"S0R = S0R x RR", {0}, {}, {}, {1}});
  return specs;
}

}  // namespace sb::strategies
