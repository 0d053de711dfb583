#pragma once

// The box that a sharding specification, given as text, puts on each rank: ColossalAI's
// sharding sequences (and its Linear strategies' names) and PyTorch ShardedTensor's
// ChunkShardingSpec.
//
// Written from those projects' documented semantics and apart from Layout and ShardingSpec
// (placement.h, sharding_spec.h), on purpose: the runner compares the layout a strategy
// declares (resultBox, which its executor shares) with the layout the specification the
// strategy claims gives (Strategy::specifiedBox). Code shared by both sides would let a wrong
// layout agree with itself, so nothing here calls the Layout code or harness/box.h's chunk
// helpers.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "harness/box.h"

namespace sb::harness {

// For each tensor dimension, the mesh axes that split it, in order; empty is replicated.
// ColossalAI's dim_partition_dict with every dimension listed.
using DimAxes = std::vector<std::vector<int>>;

// A ColossalAI sharding sequence as text: compact ("S0R", "S01R", "RS1", "S0S1", "RR") or
// bracketed ("[S0, R]", "[S01, R, R, R]", quotes around items allowed). "S01" splits its
// dimension over axis 0, then axis 1. nullopt where the text is not a sequence: an item that is
// neither R nor S followed by axis digits, or an axis used twice (ColossalAI's ShardingSpec
// rejects that in its sanity check).
std::optional<DimAxes> parseColossalSequence(const std::string& sequence);

// The box that `rank` holds of a tensor of `shape` sharded by the ColossalAI sequence
// `sequence` on a mesh of shape `mesh`, ranks laid out row-major (rank = c0 * mesh[1] + c1 on
// two axes). A dimension split over axes [a, b] is cut into mesh[a] * mesh[b] shards and the
// rank holds shard coord[a] * mesh[b] + coord[b] (the first axis outermost). ColossalAI requires
// the shards to be even; uneven ones are cut as torch.chunk cuts: ceil(n / parts) each, the last
// non-empty one smaller and any after it empty (13 over 4: 4, 4, 4, 1).
// Throws std::invalid_argument, naming the sequence, where it does not parse, has another
// number of dimensions than `shape`, or names an axis `mesh` lacks.
Box colossalSequenceBox(const std::string& sequence, at::IntArrayRef shape,
                        const std::vector<int64_t>& mesh, int rank);

// The physical sequences, bracketed, of every tensor of a Linear sharded by the strategy that
// ColossalAI's LinearProjectionStrategyGenerator names `name`, "OUT = IN x OTHER" with an
// optional "_d" after OTHER ("S0S1 = S0R x RS1_0"). The name is logical: output [M, N] = input
// [M, K] x other [K, N], M the input's leading dimensions flattened, K in_features, N
// out_features, other the weight transposed. Its linear handler turns that into physical specs:
//   input  [.., K]: M's axes on input dimension d (the "_d" suffix), K's on the last;
//   output [.., N]: M's axes on dimension d, N's on the last;
//   weight [N, K]:  OTHER transposed;
//   bias   [N]:     OTHER's N axes.
// Gradients have their operand's layout. Without a suffix M must be replicated or the input
// 2-D (then d = 0). Throws std::invalid_argument, naming `name`, where it is not of that form.
struct ColossalLinearSequences {
  std::string input, output, weight, bias;  // e.g. "[S0, R, R, R]", "[S1, R]"
};
ColossalLinearSequences colossalLinearSequences(const std::string& name, int64_t inputDims);

// PyTorch's ChunkShardingSpec: the tensor is torch.chunk'ed along `dim` into
// placements.size() chunks, and chunk i lives on rank placements[i].
struct ChunkSpec {
  int64_t dim = 0;
  std::vector<int> placements;
};
// "ChunkShardingSpec(dim=0, placements=[0, 1, 2, 3])", "ChunkShardingSpec(dim=0, [0,1,2,3])"
// or the bare "(dim=1, [2,0,3,1])"; placements as ranks, or as "rank:2/cuda:2" remote devices.
// nullopt where the text is not one.
std::optional<ChunkSpec> parseChunkShardingSpec(const std::string& text);

// The box `rank` holds of a tensor of `shape` sharded by ChunkShardingSpec(dim, placements).
// Throws std::invalid_argument where `dim` is not a dimension of `shape` or `rank` holds no
// chunk.
Box chunkSpecBox(int64_t dim, const std::vector<int>& placements, at::IntArrayRef shape, int rank);

}  // namespace sb::harness
