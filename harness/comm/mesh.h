#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace sb::harness {

// A logical device mesh: `size()` ranks laid out row-major over `shape()`. Executors name mesh
// axes (0, 1, ...) in their sharding specs; a set of axes names the process group of the ranks
// that differ only along those axes. Pure arithmetic, no communication.
class DeviceMesh {
 public:
  // `ranks` lists the global rank at each mesh position in row-major order; empty means
  // 0..size-1. Throws on an empty shape, a non-positive extent, more than kMaxRanks positions
  // or a rank count mismatch.
  explicit DeviceMesh(std::vector<int64_t> shape, std::vector<int> ranks = {});

  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t ndim() const { return static_cast<int64_t>(shape_.size()); }
  int size() const { return static_cast<int>(ranks_.size()); }
  const std::vector<int>& ranks() const { return ranks_; }

  // Mesh coordinates of a global rank. Throws if the rank is not in the mesh.
  std::vector<int64_t> coords(int rank) const;

  // Product of the extents of `axes` (1 for no axes).
  int64_t groupSize(const std::vector<int>& axes) const;

  // Position of `rank` in its group over `axes`: the row-major index of its coordinates along
  // `axes`, taken in the order given. This is the shard index of a dimension split over `axes`
  // (ColossalAI's "S01" splits over axis 0 then axis 1).
  int64_t groupIndex(int rank, const std::vector<int>& axes) const;

  // The global ranks of `rank`'s group over `axes`, ordered by their groupIndex.
  std::vector<int> groupRanks(int rank, const std::vector<int>& axes) const;

  // "2x2", "4".
  std::string toString() const;

  // The most ranks and axes a mesh may have: checked before anything is sized by the mesh, so
  // that "65536x65536" is refused instead of allocated. A command may ask for fewer.
  static constexpr int64_t kMaxRanks = int64_t{1} << 16;
  static constexpr int kMaxAxes = 8;

  // Parses "2x2" / "4": 1 to kMaxAxes extents, each at least 1, at most `maxRanks` ranks in all
  // (kMaxRanks at most). Throws c10::Error naming the text and the limit on failure.
  static std::vector<int64_t> parseShape(const std::string& text, int64_t maxRanks = kMaxRanks);

 private:
  void checkAxes(const std::vector<int>& axes) const;

  std::vector<int64_t> shape_;
  std::vector<int> ranks_;
};

}  // namespace sb::harness
