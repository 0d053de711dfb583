#include "strategies/sharding/layout/sharding_spec.h"

#include <sstream>

namespace sb::harness {

ShardingSpec ShardingSpec::replicated(int64_t ndim) {
  return ShardingSpec{std::vector<std::vector<int>>(ndim)};
}

std::vector<int> ShardingSpec::usedAxes() const {
  std::vector<int> axes;
  for (const auto& a : dimAxes) axes.insert(axes.end(), a.begin(), a.end());
  return axes;
}

std::vector<std::string> ShardingSpec::sequence() const {
  std::vector<std::string> seq;
  for (const auto& axes : dimAxes) {
    if (axes.empty()) {
      seq.emplace_back("R");
    } else {
      std::string s = "S";
      for (int a : axes) s += std::to_string(a);
      seq.push_back(s);
    }
  }
  return seq;
}

std::string ShardingSpec::sequenceString() const {
  std::string s = "[";
  auto seq = sequence();
  for (size_t i = 0; i < seq.size(); ++i) s += (i ? ", " : "") + seq[i];
  return s + "]";
}

std::optional<std::string> ShardingSpec::cannotShard(const std::string& tensor,
                                                     at::IntArrayRef shape,
                                                     const DeviceMesh& mesh) const {
  std::ostringstream os;
  if (static_cast<int64_t>(shape.size()) != ndim()) {
    os << tensor << " has " << shape.size() << " dimensions but its sharding spec "
       << sequenceString() << " has " << ndim();
    return os.str();
  }
  for (int a : usedAxes()) {
    if (a >= mesh.ndim()) {
      os << tensor << " " << sequenceString() << " uses mesh axis " << a << " but mesh "
         << mesh.toString() << " has " << mesh.ndim() << " axes";
      return os.str();
    }
  }
  for (int64_t d = 0; d < ndim(); ++d) {
    const int64_t parts = mesh.groupSize(dimAxes[d]);
    if (shape[d] % parts != 0) {
      os << tensor << " dimension " << d << " has size " << shape[d]
         << ", which does not split evenly into " << parts << " shards over mesh axes "
         << sequence()[d].substr(1) << " of mesh " << mesh.toString();
      return os.str();
    }
  }
  return std::nullopt;
}

Box ShardingSpec::box(const std::string& tensor, at::IntArrayRef shape, const DeviceMesh& mesh,
                      int rank) const {
  if (auto why = cannotShard(tensor, shape, mesh)) TORCH_CHECK(false, *why);
  Box b = Box::whole(shape);
  for (int64_t d = 0; d < ndim(); ++d) {
    if (dimAxes[d].empty()) continue;
    const int64_t parts = mesh.groupSize(dimAxes[d]);
    b.length[d] = shape[d] / parts;
    b.offset[d] = mesh.groupIndex(rank, dimAxes[d]) * b.length[d];
  }
  return b;
}

}  // namespace sb::harness
