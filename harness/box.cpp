#include "harness/box.h"

#include <algorithm>
#include <sstream>
#include <stdexcept>

#include <ATen/ATen.h>

namespace sb::harness {

Box Box::whole(at::IntArrayRef shape) {
  return Box{std::vector<int64_t>(shape.size(), 0), shape.vec()};
}

int64_t Box::numel() const {
  int64_t n = 1;
  for (int64_t l : length) n *= l;
  return n;
}

std::string Box::toString() const {
  std::ostringstream os;
  os << "[";
  for (size_t d = 0; d < offset.size(); ++d) {
    if (d) os << ", ";
    os << offset[d] << ":" << offset[d] + length[d];
  }
  os << "]";
  if (!view.empty()) {
    os << " of [";
    for (size_t d = 0; d < view.size(); ++d) os << (d ? ", " : "") << view[d];
    os << "]";
  }
  return os.str();
}

namespace {

// Per dimension of `full`, how many of the view's dimensions are its factors, in order.
std::vector<size_t> viewGroups(at::IntArrayRef full, const std::vector<int64_t>& view) {
  const auto fail = [&]() {
    std::ostringstream os;
    os << "view [";
    for (size_t d = 0; d < view.size(); ++d) os << (d ? ", " : "") << view[d];
    os << "] does not split the dimensions of a tensor of shape " << full << " into factors";
    throw std::invalid_argument(os.str());
  };
  std::vector<size_t> groups;
  size_t j = 0;
  for (int64_t n : full) {
    // At least one factor, then more while the product falls short of the dimension.
    if (j == view.size()) fail();
    int64_t product = view[j++];
    size_t count = 1;
    while (product < n && product > 0 && j < view.size()) {
      product *= view[j++];
      ++count;
    }
    if (product != n) fail();
    groups.push_back(count);
  }
  if (j != view.size()) fail();
  return groups;
}

}  // namespace

std::vector<int64_t> Box::heldShape(at::IntArrayRef full) const {
  if (view.empty()) return length;
  if (length.size() != view.size()) {
    throw std::invalid_argument("box " + toString() + " has not one length per view dimension");
  }
  std::vector<int64_t> held;
  size_t j = 0;
  for (size_t count : viewGroups(full, view)) {
    int64_t n = 1;
    for (size_t k = 0; k < count; ++k) n *= length[j++];
    held.push_back(n);
  }
  return held;
}

at::Tensor sliceBox(const at::Tensor& full, const Box& box) {
  at::Tensor t = full;
  if (!box.view.empty()) {
    viewGroups(full.sizes(), box.view);  // throws unless the view splits full's dimensions
    t = full.reshape(box.view);          // a view where full is contiguous
  }
  TORCH_INTERNAL_ASSERT(
      static_cast<int64_t>(box.offset.size()) == t.dim() && box.length.size() == box.offset.size(),
      "box ", box.toString(), " does not fit a tensor of shape ", full.sizes());
  for (int64_t d = 0; d < t.dim(); ++d) t = t.narrow(d, box.offset[d], box.length[d]);
  return t;
}

std::vector<int64_t> chunkSizes(int64_t n, int64_t parts) {
  TORCH_CHECK(parts > 0, "cannot chunk into ", parts, " parts");
  const int64_t split = (n + parts - 1) / parts;
  std::vector<int64_t> sizes(parts);
  for (int64_t i = 0; i < parts; ++i) sizes[i] = std::clamp<int64_t>(n - i * split, 0, split);
  return sizes;
}

std::vector<int64_t> chunkOffsets(int64_t n, int64_t parts) {
  auto sizes = chunkSizes(n, parts);
  std::vector<int64_t> offsets(parts, 0);
  for (int64_t i = 1; i < parts; ++i) offsets[i] = offsets[i - 1] + sizes[i - 1];
  return offsets;
}

void checkPlacements(const std::vector<int>& placements, int worldSize) {
  TORCH_CHECK(static_cast<int>(placements.size()) == worldSize, "placements name ",
              placements.size(), " ranks but the group has ", worldSize);
  std::vector<int> sorted = placements;
  std::sort(sorted.begin(), sorted.end());
  for (int i = 0; i < worldSize; ++i) {
    TORCH_CHECK(sorted[i] == i, "placements must be a permutation of 0..", worldSize - 1);
  }
}

int chunkOfRank(const std::vector<int>& placements, int rank) {
  auto it = std::find(placements.begin(), placements.end(), rank);
  TORCH_CHECK(it != placements.end(), "rank ", rank, " holds no chunk");
  return static_cast<int>(it - placements.begin());
}

Box chunkBox(at::IntArrayRef shape, int64_t dim, int64_t parts, int64_t chunk) {
  TORCH_CHECK(dim >= 0 && dim < static_cast<int64_t>(shape.size()), "chunk dimension ", dim,
              " outside a tensor of ", shape.size(), " dimensions");
  Box b = Box::whole(shape);
  b.length[dim] = chunkSizes(shape[dim], parts)[chunk];
  b.offset[dim] = chunkOffsets(shape[dim], parts)[chunk];
  return b;
}

}  // namespace sb::harness
