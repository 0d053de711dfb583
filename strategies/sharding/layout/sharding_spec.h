#pragma once

// ColossalAI's sharding spec, the even-only sequence ["S01", "R", "R", "R"] that names the
// Linear strategies (`S0S1 = S0R x RS1_0`) and gives each rank its box.
//
// Why a second model beside Layout (placement.h): a ShardingSpec is what ColossalAI's
// generators write and what its strategy names spell, and ColossalAI requires even shards, so
// the Linear family is checked against the spec it claims (a dimension that does not divide is
// `unsupported`, as in ColossalAI). Layout is DTensor's model (Shard(d) / Replicate / Partial
// per mesh axis, uneven shards as torch.chunk cuts them, pending sums); the planner and the
// operator sets work on it. Every ShardingSpec is a Layout without pending sums (layout());
// the converse holds only for even shards without Partial.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "harness/box.h"
#include "harness/comm/mesh.h"
#include "strategies/sharding/layout/placement.h"

namespace sb::harness {

// ColossalAI's sharding spec: for each tensor dimension, the mesh axes that split it, in
// order (an empty list is replicated). `{{0, 1}, {}, {}, {}}` is the sequence
// ["S01", "R", "R", "R"]: dimension 0 split four ways on a 2x2 mesh, the shard index being the
// rank's row-major index over axes (0, 1). Shards must be even, as ColossalAI requires.
struct ShardingSpec {
  std::vector<std::vector<int>> dimAxes;

  static ShardingSpec replicated(int64_t ndim);
  int64_t ndim() const { return static_cast<int64_t>(dimAxes.size()); }
  // The axes used by any dimension, in dimension order.
  std::vector<int> usedAxes() const;
  std::vector<std::string> sequence() const;  // ["S01", "R", "R", "R"]
  std::string sequenceString() const;         // "[S01, R, R, R]"
  // The same layout in the general model: these axes per dimension, no pending sums.
  Layout layout() const { return Layout(dimAxes, {}); }

  // Why `shape` cannot be sharded so on `mesh`, naming the tensor and dimension; nullopt if
  // it can.
  std::optional<std::string> cannotShard(const std::string& tensor, at::IntArrayRef shape,
                                         const DeviceMesh& mesh) const;
  // The box `rank` holds. Throws (with cannotShard's reason) if the shape does not divide.
  Box box(const std::string& tensor, at::IntArrayRef shape, const DeviceMesh& mesh, int rank) const;
};

}  // namespace sb::harness
