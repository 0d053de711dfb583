// sum: one strategy per layout of its input; a summed dimension that is sharded leaves
// pending sums, all-reduced in the forward.

#include <algorithm>

#include "strategies/sharding/ops/op_rule.h"
#include "strategies/sharding/ops/op_specs_common.h"

namespace sb::strategies {
namespace {

using harness::Layout;
using Axes = std::vector<int>;

std::vector<OpStrategySpec> sumSpecs(const reference::OpShape& s) {
  const int r = static_cast<int>(s.input.size());
  const auto reduced = s.reducedDims();
  return followingSpecs(s, false, [&](const Layout& in) {
    std::vector<Axes> d;
    Axes partial;
    for (int i = 0; i < r; ++i) {
      if (std::count(reduced.begin(), reduced.end(), i)) {
        for (int a : in.axesOf(i)) partial.push_back(a);
      } else {
        d.push_back(in.axesOf(i));
      }
    }
    const Layout out = L(d, partial);
    // ColossalAI's "[in] -> [out]", the pending sums' all-reduce not being part of a sequence.
    return FollowingOutputs{{out}, out.compact() + " = " + in.compact()};
  });
}

void sumMemory(MemoryReplay& m) {
  m.dropPreviousResults(false, false);
  m.alloc(m.O);
  m.reduceCopy();
  m.backwardBegins();
  m.alloc(m.sumG);  // sum: the expanded gradient, copied into the leaf's layout
  m.gradAllReduces();
}

OpRule sumRule() {
  OpRule r;
  r.canonicalShapes = [] {
    return std::vector<nlohmann::json>{{{"op", "sum"}, {"input", {8, 16}}, {"dims", {0}}}};
  };
  r.specs = sumSpecs;
  r.layouts = keepLayouts;
  r.faults = [](const OpStrategySpec& sp) { return commonFaults(sp, {}); };
  r.forward = [](const LocalForward& f) {
    return std::vector<at::Tensor>{f.reduce(f.in[0].sum(f.r.shape.reducedDims()))};
  };
  r.memory = sumMemory;
  r.flops = noFlops;
  r.statistics = noStatistics;
  r.reductionLength = noReduction;
  return r;
}

}  // namespace
}  // namespace sb::strategies

SB_REGISTER_OP_RULE("sum", sb::strategies::sumRule());
