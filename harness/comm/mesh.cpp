#include "harness/comm/mesh.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>

#include <c10/util/Exception.h>

namespace sb::harness {

DeviceMesh::DeviceMesh(std::vector<int64_t> shape, std::vector<int> ranks)
    : shape_(std::move(shape)), ranks_(std::move(ranks)) {
  TORCH_CHECK(!shape_.empty(), "a device mesh needs at least one axis");
  int64_t n = 1;
  for (int64_t extent : shape_) {
    TORCH_CHECK(extent > 0, "mesh extents must be positive, got ", toString());
    // Checked before the product can overflow: the rank list below is sized by it.
    TORCH_CHECK(extent <= kMaxRanks / n, "mesh ", toString(), " has more than ", kMaxRanks,
                " positions");
    n *= extent;
  }
  if (ranks_.empty()) {
    ranks_.resize(n);
    std::iota(ranks_.begin(), ranks_.end(), 0);
  }
  TORCH_CHECK(static_cast<int64_t>(ranks_.size()) == n, "mesh ", toString(), " has ", n,
              " positions but ", ranks_.size(), " ranks were given");
}

std::vector<int64_t> DeviceMesh::coords(int rank) const {
  auto it = std::find(ranks_.begin(), ranks_.end(), rank);
  TORCH_CHECK(it != ranks_.end(), "rank ", rank, " is not in mesh ", toString());
  int64_t flat = it - ranks_.begin();
  std::vector<int64_t> c(shape_.size());
  for (int64_t axis = ndim() - 1; axis >= 0; --axis) {
    c[axis] = flat % shape_[axis];
    flat /= shape_[axis];
  }
  return c;
}

void DeviceMesh::checkAxes(const std::vector<int>& axes) const {
  for (size_t i = 0; i < axes.size(); ++i) {
    TORCH_CHECK(axes[i] >= 0 && axes[i] < ndim(), "mesh axis ", axes[i], " does not exist in mesh ",
                toString());
    for (size_t j = 0; j < i; ++j) {
      TORCH_CHECK(axes[i] != axes[j], "mesh axis ", axes[i], " named twice");
    }
  }
}

int64_t DeviceMesh::groupSize(const std::vector<int>& axes) const {
  checkAxes(axes);
  int64_t n = 1;
  for (int axis : axes) n *= shape_[axis];
  return n;
}

int64_t DeviceMesh::groupIndex(int rank, const std::vector<int>& axes) const {
  checkAxes(axes);
  auto c = coords(rank);
  int64_t index = 0;
  for (int axis : axes) index = index * shape_[axis] + c[axis];
  return index;
}

std::vector<int> DeviceMesh::groupRanks(int rank, const std::vector<int>& axes) const {
  checkAxes(axes);
  const auto base = coords(rank);
  const int64_t n = groupSize(axes);
  std::vector<int> out(n);
  for (int64_t index = 0; index < n; ++index) {
    auto c = base;
    int64_t rest = index;
    for (auto it = axes.rbegin(); it != axes.rend(); ++it) {
      c[*it] = rest % shape_[*it];
      rest /= shape_[*it];
    }
    int64_t flat = 0;
    for (int64_t axis = 0; axis < ndim(); ++axis) flat = flat * shape_[axis] + c[axis];
    out[index] = ranks_[flat];
  }
  return out;
}

std::string DeviceMesh::toString() const {
  std::string s;
  for (size_t i = 0; i < shape_.size(); ++i) {
    if (i) s += "x";
    s += std::to_string(shape_[i]);
  }
  return s;
}

std::vector<int64_t> DeviceMesh::parseShape(const std::string& text, int64_t maxRanks) {
  maxRanks = std::min(maxRanks, kMaxRanks);
  std::vector<int64_t> shape;
  int64_t ranks = 1;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find('x', pos);
    if (end == std::string::npos) end = text.size();
    const std::string part = text.substr(pos, end - pos);
    TORCH_CHECK(!part.empty() && part.find_first_not_of("0123456789") == std::string::npos,
                "mesh '", text, "' is not of the form RxC or N (e.g. 2x2, 4)");
    TORCH_CHECK(static_cast<int>(shape.size()) < kMaxAxes, "mesh '", text, "' has more than ",
                kMaxAxes, " axes");
    // Digits past the limit's length are over it: no conversion that could overflow.
    const size_t digits = part.find_first_not_of('0') == std::string::npos
                              ? 1
                              : part.size() - part.find_first_not_of('0');
    const int64_t extent = digits > 12 ? maxRanks + 1 : std::stoll(part);
    TORCH_CHECK(extent >= 1, "mesh '", text, "': every extent must be at least 1");
    TORCH_CHECK(extent <= maxRanks / ranks, "mesh '", text, "' has more than ", maxRanks,
                " ranks, the most this command takes");
    ranks *= extent;
    shape.push_back(extent);
    pos = end + 1;
  }
  return shape;
}

}  // namespace sb::harness
