// Operators whose outputs are views of their input: view, permute, transpose and split. One
// strategy per layout of the input (split keeps its dimension whole); a permutation moves the
// input's shards with its dimensions, and a view maps them to its output's shape when a case
// applies it (viewLayout), or names the dimension whose shards it would interleave. Their
// outputs (and, for view, the input's gradient) allocate nothing of their own.

#include <numeric>

#include "strategies/sharding/ops/op_rule.h"
#include "strategies/sharding/ops/op_specs_common.h"

namespace sb::strategies {
namespace {

using harness::Layout;
using Axes = std::vector<int>;

// The input-to-output mapping of a view: groups of input dimensions whose product equals the
// product of a group of output dimensions, in order.
struct ViewGroup {
  std::vector<int> in, out;
};
std::vector<ViewGroup> viewGroups(const std::vector<int64_t>& in, const std::vector<int64_t>& out) {
  std::vector<ViewGroup> groups;
  size_t i = 0, o = 0;
  while (i < in.size() || o < out.size()) {
    ViewGroup g;
    int64_t pi = 1, po = 1;
    do {
      if (i < in.size() && (pi <= po || o >= out.size())) {
        pi *= in[i];
        g.in.push_back(static_cast<int>(i++));
      } else if (o < out.size()) {
        po *= out[o];
        g.out.push_back(static_cast<int>(o++));
      }
    } while ((pi != po || g.in.empty() || g.out.empty()) && (i < in.size() || o < out.size()));
    // Absorb trailing extents of 1 into this group.
    while (i < in.size() && in[i] == 1 && o >= out.size()) g.in.push_back(static_cast<int>(i++));
    while (o < out.size() && out[o] == 1 && i >= in.size()) g.out.push_back(static_cast<int>(o++));
    groups.push_back(g);
  }
  return groups;
}

// The output layout of a view of an input laid out as `in`, or a message naming the dimension
// whose shards the view would interleave. Per group, the input's shards must cover one
// contiguous block of the flattened group: every sharded dimension but the last has one index
// per rank (e.g. batch 2 over 2 ranks, heads split inside: [B, H] -> [B * H] sharded over both
// axes, outer first); the flattened block is then cut the same way into the output's
// dimensions.
std::string viewLayout(const std::vector<int64_t>& inShape, const std::vector<int64_t>& outShape,
                       const Layout& in, const harness::DeviceMesh& mesh, Layout& out) {
  std::vector<Axes> dims(outShape.size());
  for (const auto& g : viewGroups(inShape, outShape)) {
    Axes axes;
    int last = -1;
    for (size_t k = 0; k < g.in.size(); ++k) {
      if (!in.axesOf(g.in[k]).empty()) last = static_cast<int>(k);
    }
    for (int k = 0; k <= last; ++k) {
      const int d = g.in[k];
      const Axes& a = in.axesOf(d);
      const int64_t parts = mesh.groupSize(a);
      if (k < last && inShape[d] / parts != 1) {
        const int inner = g.in[last];
        return "view: dimension " + std::to_string(inner) + " of the input (size " +
               std::to_string(inShape[inner]) + ", sharded " + in.compact() +
               ") is split inside dimension " + std::to_string(d) + " (size " +
               std::to_string(inShape[d]) + ", " + std::to_string(inShape[d] / parts) +
               " indices per rank): the view interleaves its shards";
      }
      axes.insert(axes.end(), a.begin(), a.end());
    }
    // Cut the flattened block into the output dimensions, outermost first.
    size_t next = 0;
    for (size_t k = 0; k < g.out.size() && next < axes.size(); ++k) {
      const int d = g.out[k];
      int64_t rest = 1;
      for (size_t a = next; a < axes.size(); ++a) rest *= mesh.groupSize({axes[a]});
      if (outShape[d] % rest == 0) {  // the remaining axes all split this dimension
        dims[d].assign(axes.begin() + static_cast<long>(next), axes.end());
        next = axes.size();
        break;
      }
      int64_t taken = 1;
      size_t end = next;
      while (end < axes.size() && taken < outShape[d]) taken *= mesh.groupSize({axes[end++]});
      if (taken != outShape[d]) {
        return "view: the input's shards (" + in.compact() + ") do not cut output dimension " +
               std::to_string(d) + " (size " + std::to_string(outShape[d]) + ") evenly";
      }
      dims[d].assign(axes.begin() + static_cast<long>(next), axes.begin() + static_cast<long>(end));
      next = end;
    }
    if (next < axes.size()) {
      return "view: the input's shards (" + in.compact() +
             ") do not map to the output's dimensions";
    }
  }
  out = Layout(dims, {});
  return "";
}

std::vector<OpStrategySpec> viewSpecs(const reference::OpShape& s) {
  auto out = followingSpecs(s, false, [](const Layout& in) {
    // replaced by the shape's mapping when applied
    return FollowingOutputs{{in}, "view(" + in.compact() + ")"};
  });
  for (auto& sp : out) sp.outputFromShape = true;
  return out;
}

void viewLayouts(ResolvedOp& r, const harness::DeviceMesh& mesh) {
  if (r.spec.outputFromShape) {  // view: map each input dimension's shards to the output
    Layout out;
    r.problem = viewLayout(r.shape.input, r.shape.outputs()[0], r.operands[0], mesh, out);
    if (!r.problem.empty()) return;
    r.outputs = {out};
  }
}

std::vector<OpStrategySpec> permuteSpecs(const reference::OpShape& s) {
  const int r = static_cast<int>(s.input.size());
  return followingSpecs(s, false, [&](const Layout& in) {
    const auto perm = s.op == "transpose"
                          ? [&] {
                              std::vector<int64_t> p(r);
                              std::iota(p.begin(), p.end(), 0);
                              std::swap(p[(s.attrInt("dim0") + r) % r],
                                        p[(s.attrInt("dim1") + r) % r]);
                              return p;
                            }()
                          : [&] {
                              std::vector<int64_t> p;
                              for (int64_t d : s.attrDims("dims")) p.push_back((d + r) % r);
                              return p;
                            }();
    std::vector<Axes> d;
    for (int64_t p : perm) d.push_back(in.axesOf(static_cast<int>(p)));
    return FollowingOutputs{{L(d)}, in.compact() + " = " + in.compact()};
  });
}

std::vector<OpStrategySpec> splitSpecs(const reference::OpShape& s) {
  return followingSpecs(s, true, [&](const Layout& in) {
    FollowingOutputs outs{{}, in.compact() + " = " + in.compact()};
    for (size_t i = 0; i < s.outputs().size(); ++i) outs.layouts.push_back(in);
    return outs;
  });
}

OpRule viewLikeRule(nlohmann::json canonical) {
  OpRule r;
  r.canonicalShapes = [canonical] { return std::vector<nlohmann::json>{canonical}; };
  r.specs = permuteSpecs;
  r.layouts = keepLayouts;
  r.faults = [](const OpStrategySpec& sp) { return commonFaults(sp, {}); };
  r.forward = referenceForward;
  // permute, transpose: their output a view of the input, then the input's gradient.
  r.memory = [](MemoryReplay& m) {
    m.dropPreviousResults(true, false);
    m.alloc(m.sumG);
  };
  r.flops = noFlops;
  r.statistics = noStatistics;
  r.reductionLength = noReduction;
  return r;
}

OpRule viewRule() {
  OpRule r = viewLikeRule({{"op", "view"}, {"input", {8, 16}}, {"size", {128}}});
  r.specs = viewSpecs;
  r.layouts = viewLayouts;
  r.forward = [](const LocalForward& f) {
    return std::vector<at::Tensor>{
        f.in[0].reshape(f.r.outputs[0].box(f.r.shape.outputs()[0], f.mesh, f.coords).length)};
  };
  // A view forward; the gradient a view of the seed.
  r.memory = [](MemoryReplay& m) { m.dropPreviousResults(true, true); };
  return r;
}

OpRule splitRule() {
  OpRule r = viewLikeRule({{"op", "split"}, {"input", {8, 16}}, {"split_size", 8}, {"dim", 1}});
  r.specs = splitSpecs;
  r.forward = [](const LocalForward& f) {
    const reference::OpShape& s = f.r.shape;
    auto parts = f.in[0].split(s.attrInt("split_size"), s.reducedDims()[0]);
    return std::vector<at::Tensor>(parts.begin(), parts.end());
  };
  r.memory = [](MemoryReplay& m) {
    m.dropPreviousResults(true, false);
    m.alloc(m.X);  // the gradients concatenated
  };
  return r;
}

}  // namespace
}  // namespace sb::strategies

SB_REGISTER_OP_RULE("view", sb::strategies::viewRule());
SB_REGISTER_OP_RULE("permute", sb::strategies::viewLikeRule({{"op", "permute"},
                                                             {"input", {4, 8, 16}},
                                                             {"dims", {2, 0, 1}}}));
SB_REGISTER_OP_RULE("transpose",
                    sb::strategies::viewLikeRule(
                        {{"op", "transpose"}, {"input", {8, 16}}, {"dim0", 0}, {"dim1", 1}}));
SB_REGISTER_OP_RULE("split", sb::strategies::splitRule());
