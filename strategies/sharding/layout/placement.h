#pragma once

// Layouts of a tensor on a device mesh, in both of the field's spellings.
//
// A layout says, for each mesh axis, what the ranks along that axis hold of the tensor:
//   Shard(d)   a torch.chunk piece of dimension d (uneven sizes as torch.chunk makes them:
//              13 over 4 is 4, 4, 4, 1; 2 over 4 is 1, 1, 0, 0);
//   Replicate  the same values;
//   Partial    pending sums: the tensor is the sum of what the ranks along the axis hold.
// Several axes that shard one dimension nest: the outer axis chunks the dimension, the next
// chunks the outer axis's piece, and so on. DTensor nests in mesh-axis order; ColossalAI's
// sharding sequence names the order explicitly ("S01": axis 0 outer, "S10": axis 1 outer), so
// the layout keeps, per tensor dimension, its axes outermost first. For even sizes nesting is
// the same as one flat chunk over the product of the axes (ColossalAI's convention); for uneven
// sizes it is DTensor's.
//
// Spellings, parsed and printed:
//   DTensor     `[Shard(0), Replicate()]`, `[Partial(sum), Shard(1)]`, short `[S(0), R]`, `[P, R]`:
//               one placement per mesh axis (only layouts nested in mesh order).
//   ColossalAI  `[S01, R, R]`, one entry per tensor dimension, with pending sums after it as
//               `[R, S0, R] P1`; compact `S01RR`, `RS0RP1` (the form used in strategy ids).
// Placements in non-rank order (ShardedTensor's `placements=[2, 0, 3, 1]`) are a property of the
// mesh, not of the layout: a DeviceMesh over ranks {2, 0, 3, 1} with layout `[S0]` puts chunk i
// on rank placements[i].

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "harness/box.h"

namespace sb::harness {

// A malformed or impossible layout; the message names the layout text and what is wrong.
class LayoutError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// One mesh axis's placement, as DTensor names it.
struct Placement {
  enum class Kind { kReplicate, kShard, kPartial };
  Kind kind = Kind::kReplicate;
  int dim = -1;  // for kShard

  static Placement replicate() { return {Kind::kReplicate, -1}; }
  static Placement shard(int d) { return {Kind::kShard, d}; }
  static Placement partial() { return {Kind::kPartial, -1}; }
  bool operator==(const Placement& o) const { return kind == o.kind && dim == o.dim; }
  std::string toString() const;  // "Shard(0)", "Replicate()", "Partial(sum)"
};

class Layout {
 public:
  // Fully replicated.
  explicit Layout(int ndim = 0) : dimAxes_(ndim) {}
  // Per tensor dimension its axes, outermost first, and the axes holding pending sums. Throws
  // LayoutError if an axis is used twice.
  Layout(std::vector<std::vector<int>> dimAxes, std::vector<int> partialAxes);

  // DTensor's one-placement-per-mesh-axis form; shards of one dimension nest in axis order.
  static Layout fromPlacements(const std::vector<Placement>& placements, int ndim);

  // Parses any spelling above for a tensor of `ndim` dimensions on a mesh of `meshNdim` axes.
  // Throws LayoutError naming the text and the problem: a dimension the tensor does not have, an
  // axis the mesh does not have, an axis used twice, the wrong number of entries, a token that
  // is not a placement.
  static Layout parse(const std::string& text, int ndim, int meshNdim);

  int ndim() const { return static_cast<int>(dimAxes_.size()); }
  const std::vector<std::vector<int>>& dimAxes() const { return dimAxes_; }
  const std::vector<int>& axesOf(int dim) const { return dimAxes_.at(dim); }
  const std::vector<int>& partialAxes() const { return partialAxes_; }
  bool isPartial(int axis) const;
  // The dimension `axis` shards, or -1.
  int shardDimOf(int axis) const;
  // The largest mesh axis used, or -1: the layout fits any mesh with more axes than this.
  int maxAxis() const;
  // The placement on every axis of a mesh of `meshNdim` axes.
  std::vector<Placement> placements(int meshNdim) const;
  // Every dimension's axes are in increasing order: expressible in DTensor's spelling.
  bool meshOrdered() const;

  std::string sequence() const;  // "[R, S01, R]", "[R, S0, R] P1"
  std::string compact() const;   // "RS01R", "RS0RP1"
  // "[Replicate(), Shard(1)]"; throws LayoutError for a layout not nested in mesh order.
  std::string dtensor(int meshNdim) const;

  // The layout of this tensor's gradient under the transpose of a redistribution: Replicate and
  // Partial swap, shards stay. (The gradient of a replicated tensor arrives as partial sums
  // from its consumers; the gradient of pending sums is the same on every rank.)
  Layout dual(int meshNdim) const;

  // The piece that the rank at mesh coordinates `coords` holds of a tensor of `shape` on a mesh
  // of extents `mesh`: nested torch.chunk along each dimension. Pending sums hold the whole box.
  Box box(const std::vector<int64_t>& shape, const std::vector<int64_t>& mesh,
          const std::vector<int64_t>& coords) const;

  bool operator==(const Layout& o) const {
    return dimAxes_ == o.dimAxes_ && partialAxes_ == o.partialAxes_;
  }
  bool operator!=(const Layout& o) const { return !(*this == o); }
  bool operator<(const Layout& o) const {
    return dimAxes_ != o.dimAxes_ ? dimAxes_ < o.dimAxes_ : partialAxes_ < o.partialAxes_;
  }

 private:
  std::vector<std::vector<int>> dimAxes_;
  std::vector<int> partialAxes_;  // sorted
};

// Every layout of an `ndim`-dimensional tensor on a mesh of `meshNdim` axes with shards nested
// in mesh order and at most `maxPartial` axes of pending sums, in a stable order (replicated
// first). On a 2x2 mesh a 3-D tensor has 24 with at most one partial axis.
std::vector<Layout> enumerateLayouts(int ndim, int meshNdim, int maxPartial);

// Nested torch.chunk: the (offset, length) of piece `index` (row-major over `extents`) of a
// range of `length`, chunked over the extents outermost first.
std::pair<int64_t, int64_t> nestedChunk(int64_t length, const std::vector<int64_t>& extents,
                                        const std::vector<int64_t>& indices);

}  // namespace sb::harness
