#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace sb::harness {

// The part of a full tensor that one rank holds: an offset and a length per dimension.
// Replicas are ranks with equal boxes.
//
// A piece that is one box only of a view of the tensor names the view: `view` splits some of the
// tensor's dimensions into factors (GPT-2's fused qkv weight [3D, D] as [3, D, D]), and offset
// and length are in the view's dimensions. DTensor's _StridedShard(0, split_factor=3) on a 1-D
// mesh, a rank's rows of q, k and v, is Shard(1) of that view. Empty: the tensor's own shape.
struct Box {
  std::vector<int64_t> offset;
  std::vector<int64_t> length;
  std::vector<int64_t> view = {};

  static Box whole(at::IntArrayRef shape);
  int64_t numel() const;
  bool operator==(const Box& o) const {
    return offset == o.offset && length == o.length && view == o.view;
  }
  std::string toString() const;  // "[0:2, 0:4, 0:4, 0:16]", "[0:3, 0:4, 0:8] of [3, 8, 8]"
  // The shape a rank holds its piece in, of a tensor of shape `full`: the lengths, the view's
  // factors of each of the tensor's dimensions merged back (DTensor's local tensor of a
  // _StridedShard: [3 x 4, 8] for the box [0:3, 0:4, 0:8] of [3, 8, 8]). Throws
  // std::invalid_argument unless the view splits `full`'s dimensions into factors.
  std::vector<int64_t> heldShape(at::IntArrayRef full) const;
};

// `full[box]` (of the box's view of `full` where it has one), a view of a contiguous `full`.
at::Tensor sliceBox(const at::Tensor& full, const Box& box);

// torch.chunk / ShardedTensor's ChunkShardingSpec sizes: every chunk holds ceil(n / parts)
// except the last non-empty one, which holds the rest; trailing chunks may be empty
// (13 over 4 gives 4, 4, 4, 1; 2 over 4 gives 1, 1, 0, 0).
std::vector<int64_t> chunkSizes(int64_t n, int64_t parts);
std::vector<int64_t> chunkOffsets(int64_t n, int64_t parts);

// ShardedTensor's placement of chunks on ranks: chunk `i` lives on rank `placements[i]`.
// Throws unless `placements` is a permutation of 0..n-1.
void checkPlacements(const std::vector<int>& placements, int worldSize);
// The chunk index that `rank` holds.
int chunkOfRank(const std::vector<int>& placements, int rank);

// The box of a tensor chunked along `dim` with chunk `chunk` of `parts`.
Box chunkBox(at::IntArrayRef shape, int64_t dim, int64_t parts, int64_t chunk);

}  // namespace sb::harness
