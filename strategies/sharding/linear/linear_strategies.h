#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "harness/strategy.h"
#include "strategies/sharding/layout/sharding_spec.h"

namespace sb::strategies {

// Deliberate bugs, for the planted-fault tests only: each must make the harness report `fail`.
enum class PlantedFault {
  kNone,
  kSkipForwardAllReduce,  // the partial sums of a split contraction are never all-reduced
  kShardOffsetOffByOne,   // the input shard is taken one row away from where the spec puts it
  kIgnorePlacements,      // chunks are assumed to be in rank order whatever the placements say
  // A layout other than the named one, declared and computed alike (the mesh axes swapped;
  // ShardedTensor's placements rotated), so that every tensor check passes: only the check of
  // the declared layout against the specification (Strategy::specifiedBox) can catch it.
  kConsistentWrongLayout,
};

// "skip_forward_all_reduce", "shard_offset_off_by_one", "ignore_placements",
// "consistent_wrong_layout" ("none" for kNone).
const char* plantedFaultName(PlantedFault f);
// The fault named `name` if it is one of `supported`; nullopt otherwise.
std::optional<PlantedFault> parsePlantedFault(const std::string& name,
                                              const std::vector<PlantedFault>& supported);
std::vector<std::string> plantedFaultNames(const std::vector<PlantedFault>& faults);

// A Linear sharding strategy of ColossalAI's auto-parallel linear handler: each of the batch
// (the input's non-feature dimensions, logically flattened), in-feature and out-feature
// dimensions is split over a set of mesh axes (possibly none).
struct LinearMeshSpec {
  std::string name;            // ColossalAI's logical name, e.g. "S0S1 = S0R x RS1"
  std::vector<int> batchAxes;  // splits the input's physical dim `batchDim`
  std::vector<int> inAxes;     // splits in_features (the contraction)
  std::vector<int> outAxes;    // splits out_features
  std::vector<int> meshDims;   // mesh ranks (numbers of axes) the generator emits it for
};

// The strategy for `spec`; `batchDim` is the physical input dimension the batch split lands on
// (ColossalAI's "_0", "_1", "_2" suffix), -1 when the batch is not split.
std::unique_ptr<harness::Strategy> makeLinearMeshStrategy(const LinearMeshSpec& spec, int batchDim,
                                                          PlantedFault fault = PlantedFault::kNone,
                                                          const std::string& idPrefix = "");

// PyTorch ShardedTensor's sharded Linear on a 1-D mesh: the weight chunked along its rows
// ("colwise": out_features) or its columns ("rowwise": in_features), chunk i on rank
// placements[i]. Empty placements mean rank order on any 1-D mesh.
std::unique_ptr<harness::Strategy> makeShardedTensorColwise(
    std::vector<int> placements, PlantedFault fault = PlantedFault::kNone,
    const std::string& idPrefix = "");
std::unique_ptr<harness::Strategy> makeShardedTensorRowwise(
    std::vector<int> placements, PlantedFault fault = PlantedFault::kNone,
    const std::string& idPrefix = "");

// The logical strategies of ColossalAI's LinearProjectionStrategyGenerator on a 2-D mesh, and
// their 1-D mesh counterparts.
std::vector<LinearMeshSpec> linearMeshSpecs();

}  // namespace sb::strategies
