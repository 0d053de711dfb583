#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace sb::harness {

// The part of a full tensor that one rank holds: an offset and a length per dimension.
// Replicas are ranks with equal boxes.
struct Box {
  std::vector<int64_t> offset;
  std::vector<int64_t> length;

  static Box whole(at::IntArrayRef shape);
  int64_t numel() const;
  bool operator==(const Box& o) const { return offset == o.offset && length == o.length; }
  std::string toString() const;  // "[0:2, 0:4, 0:4, 0:16]"
};

// `full[box]`, a view.
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
