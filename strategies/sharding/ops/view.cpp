// Operators whose outputs are views of their input: view, reshape, permute, transpose and
// split (ColossalAI's ViewGenerator, DefaultReshapeGenerator, PermuteGenerator,
// TransposeGenerator, SplitGenerator), and contiguous, which copies a permuted one. One strategy
// per layout of the input (split keeps its dimension whole); a permutation moves the input's shards
// with its dimensions, and a view maps them to its output's shape when a case applies it
// (viewLayout), or names the dimension whose shards it would interleave. Where ColossalAI's rule
// cannot keep a view's shards (colossalViewOutput), its gathering strategy is there too, and every
// reshape gathers: the input is gathered whole first and the output replicated ("[S0, R] -> FULLY
// REPLICATED_1"; OpStrategySpec::gatherInput). Their outputs (and, for view, the input's gradient)
// allocate nothing of their own beyond the gathered input.
//
// The planted fault of a gathering strategy hands every rank the first rank's box of the whole
// gradient instead of its own.

#include <numeric>
#include <optional>

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

// The output layout of a view of an input laid out as `in`, as ColossalAI's ViewGenerator
// infers it (check_keep_sharding_status, infer_output_dim_partition_dict), or nullopt where it
// gathers the input instead. It keeps the shards when every group of input dimensions that the
// view merges or splits holds one sharded dimension at most, the group's first (outermost):
// its shards are then contiguous blocks of the flattened group, and go to the group's first
// output dimension. A rule of the shapes alone; an output dimension that the shards do not
// divide is refused when the case is resolved (resolveOp), naming it.
std::optional<Layout> colossalViewOutput(const reference::OpShape& s, const Layout& in) {
  const auto outShape = s.outputs()[0];
  std::vector<Axes> out(outShape.size());
  for (const auto& g : viewGroups(s.input, outShape)) {
    int sharded = 0;
    for (int d : g.in) sharded += in.axesOf(d).empty() ? 0 : 1;
    if (sharded == 0) continue;
    if (sharded > 1 || in.axesOf(g.in.front()).empty() || g.out.empty()) return std::nullopt;
    out[g.out.front()] = in.axesOf(g.in.front());
  }
  return L(out);
}

// A strategy that gathers its input whole (OpStrategySpec::gatherInput), its output replicated.
void gatherWhole(OpStrategySpec& sp, const reference::OpShape& s) {
  sp.gatherInput = true;
  sp.variant = "gather";
  sp.outputFromShape = false;
  sp.outputLayouts = {Layout(static_cast<int>(s.outputs()[0].size()))};
}

// One strategy per layout of the input that keeps its shards, mapped to the output by
// viewLayout when a case applies it (under the same ids as always), and, where ColossalAI's
// ViewGenerator gathers instead, ColossalAI's gathering strategy beside it (id
// "gather(S0S1)"). Ours keeps shards in more cases than ColossalAI's rule (several sharded
// dimensions merged, the outer ones one index per rank: gpt2's heads folded into the batch);
// those are the `beyond` set, named after the input with the mapping left to the case.
std::vector<OpStrategySpec> viewSpecs(const reference::OpShape& s) {
  const auto keep = followingSpecs(s, false, [&](const Layout& in) {
    const auto colossal = colossalViewOutput(s, in);
    return FollowingOutputs{
        {in},
        "view(" + in.compact() + ")",
        colossalSeq(in) + " -> " + (colossal ? colossalSeq(*colossal) : "VIEWED SHARDS")};
  });
  std::vector<OpStrategySpec> out;
  for (auto sp : keep) {
    sp.outputFromShape = true;
    const bool colossalKeeps = colossalViewOutput(s, sp.operandLayouts[0]).has_value();
    if (!colossalKeeps) sp.set = "beyond";
    out.push_back(sp);
    if (!colossalKeeps) {
      OpStrategySpec g = sp;
      g.set = "colossalai";
      g.name = "gather(" + sp.operandLayouts[0].compact() + ")";
      const std::string suffix = sp.colossalName.substr(sp.colossalName.rfind('_'));
      g.colossalName = colossalSeq(sp.operandLayouts[0]) + " -> FULLY REPLICATED" + suffix;
      gatherWhole(g, s);
      out.push_back(g);
    }
  }
  return out;
}

// reshape: ColossalAI's DefaultReshapeGenerator, every layout of the input gathered whole.
std::vector<OpStrategySpec> reshapeSpecs(const reference::OpShape& s) {
  auto out = followingSpecs(s, false, [&](const Layout& in) {
    return FollowingOutputs{
        {in}, "reshape(" + in.compact() + ")", colossalSeq(in) + " -> FULLY REPLICATED"};
  });
  for (auto& sp : out) gatherWhole(sp, s);
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
    return FollowingOutputs{{L(d)}, in.compact() + " = " + in.compact()};  // [in] -> [out]
  });
}

std::vector<OpStrategySpec> splitSpecs(const reference::OpShape& s) {
  return followingSpecs(s, true, [&](const Layout& in) {
    // ColossalAI's SplitGenerator names a strategy after its input alone: "[in]_<index>".
    FollowingOutputs outs{{}, in.compact() + " = " + in.compact(), colossalSeq(in)};
    for (size_t i = 0; i < s.outputs().size(); ++i) outs.layouts.push_back(in);
    return outs;
  });
}

// Whether the operator transposes a 2-D input (transpose of its two dimensions, permute
// [1, 0]): its gradient is then the seed's transposed view, copied.
bool swapsTwoDims(const reference::OpShape& s) {
  if (s.input.size() != 2) return false;
  const auto norm = [](int64_t d) { return d < 0 ? d + 2 : d; };
  if (s.op == "transpose") {
    return norm(s.attrs.at("dim0").get<int64_t>()) != norm(s.attrs.at("dim1").get<int64_t>());
  }
  return s.op == "permute" && norm(s.attrs.at("dims").at(0).get<int64_t>()) == 1;
}

// Output dimension i of a permute or transpose is input dimension permutation(s)[i].
std::vector<int64_t> permutation(const reference::OpShape& s) {
  const auto r = static_cast<int64_t>(s.input.size());
  const auto norm = [r](int64_t d) { return d < 0 ? d + r : d; };
  std::vector<int64_t> p(static_cast<size_t>(r));
  std::iota(p.begin(), p.end(), 0);
  if (s.op == "transpose") {
    std::swap(p[static_cast<size_t>(norm(s.attrs.at("dim0").get<int64_t>()))],
              p[static_cast<size_t>(norm(s.attrs.at("dim1").get<int64_t>()))]);
  } else {
    for (size_t i = 0; i < p.size(); ++i) p[i] = norm(s.attrs.at("dims").at(i).get<int64_t>());
  }
  return p;
}

// Whether the seed (contiguous, in the output's order) permuted back is laid out as the local
// input `length` is: its dimensions of extent above 1 keep their order. Autograd then keeps
// it as the input's gradient without a copy (a layout that agrees on every dimension of extent
// above 1 obeys the gradient's layout contract): a rank's piece of one row transposed.
bool seedKeepsLayout(const reference::OpShape& s, const std::vector<int64_t>& length) {
  int64_t last = -1;
  for (int64_t d : permutation(s)) {
    if (length[static_cast<size_t>(d)] == 1) continue;
    if (d < last) return false;
    last = d;
  }
  return true;
}

OpRule viewLikeRule(nlohmann::json canonical) {
  OpRule r;
  r.canonicalShapes = [canonical] { return std::vector<nlohmann::json>{canonical}; };
  r.specs = permuteSpecs;
  r.layouts = keepLayouts;
  r.faults = [](const OpStrategySpec& sp) { return commonFaults(sp, {}); };
  r.forward = referenceForward;
  // permute, transpose: their output a view of the input, then the input's gradient, a copy of
  // the seed's transposed view (none where that view is laid out as the input: seedKeepsLayout).
  // ATen copies a transposed 2-D tensor of at least 60 x 60 elements through a 60 x 60 block buffer
  // of its type (copy_transpose_valid, Copy.cpp), alive during the copy: found by the sweep at [64,
  // 256], which the canonical [8, 16] is too small to show.
  r.memory = [](MemoryReplay& m) {
    const bool viewOfSeed = seedKeepsLayout(m.r.shape, m.leaves[0].sizes().vec());
    m.dropPreviousResults(true, viewOfSeed);
    m.backwardBegins();
    if (viewOfSeed) return;
    m.alloc(m.sumG);
    if (swapsTwoDims(m.r.shape) && m.n >= 60 * 60) {
      m.alloc(60 * 60 * m.es);
      m.release(60 * 60 * m.es);
    }
  };
  r.flops = noFlops;
  r.statistics = noStatistics;
  r.reductionLength = noReduction;
  return r;
}

// A view forward; the gradient a view of the seed. Gathered first (a FULLY REPLICATED
// strategy): the output a view of the gathered input, and the input's gradient this rank's box
// of the seed, copied.
void viewMemory(MemoryReplay& m) {
  if (!m.gathersInput()) {
    m.dropPreviousResults(true, true);
    m.backwardBegins();
    return;
  }
  m.dropPreviousResults(false, false);
  m.gatherInput();
  m.backwardBegins();
  m.alloc(m.sumG);
}

OpRule viewRule(nlohmann::json canonical,
                std::function<std::vector<OpStrategySpec>(const reference::OpShape&)> specs) {
  OpRule r = viewLikeRule(std::move(canonical));
  r.specs = std::move(specs);
  r.layouts = viewLayouts;
  // On this rank's piece, or on the whole input once gathered (runOp).
  r.forward = [](const LocalForward& f) {
    return std::vector<at::Tensor>{
        f.in[0].reshape(f.r.outputs[0].box(f.r.shape.outputs()[0], f.mesh, f.coords).length)};
  };
  r.memory = viewMemory;
  r.faults = [](const OpStrategySpec& sp) {
    return commonFaults(sp, sp.gatherInput && !usedAxes(sp.operandLayouts[0]).empty()
                                ? std::vector<std::string>{"gather_first_box"}
                                : std::vector<std::string>{});
  };
  return r;
}

// contiguous: Tensor::contiguous, the layout of its input kept (one strategy per layout, the
// output's box the input's). Where its input is a permuted view (attention's heads before a
// batched matmul) it copies; the plan's replay follows the strides. A single operator's input
// is a contiguous leaf: the output is the leaf itself, no autograd node is recorded, and the
// engine's accumulation copies the seed as the leaf's gradient (it is still held by the step).
OpRule contiguousRule() {
  OpRule r = viewLikeRule({{"op", "contiguous"}, {"input", {4, 8, 16}}});
  r.specs = [](const reference::OpShape& s) { return followingSpecs(s, false, sameLayout); };
  r.memory = [](MemoryReplay& m) {
    m.dropPreviousResults(true, false);
    m.backwardBegins();
    m.alloc(m.sumG);
  };
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
    m.backwardBegins();
    m.alloc(m.X);  // the gradients concatenated
  };
  return r;
}

}  // namespace
}  // namespace sb::strategies

SB_REGISTER_OP_RULE("view",
                    sb::strategies::viewRule({{"op", "view"}, {"input", {8, 16}}, {"size", {128}}},
                                             sb::strategies::viewSpecs));
SB_REGISTER_OP_RULE(
    "reshape", sb::strategies::viewRule({{"op", "reshape"}, {"input", {8, 16}}, {"size", {4, 32}}},
                                        sb::strategies::reshapeSpecs));
SB_REGISTER_OP_RULE("permute", sb::strategies::viewLikeRule({{"op", "permute"},
                                                             {"input", {4, 8, 16}},
                                                             {"dims", {2, 0, 1}}}));
SB_REGISTER_OP_RULE("transpose",
                    sb::strategies::viewLikeRule(
                        {{"op", "transpose"}, {"input", {8, 16}}, {"dim0", 0}, {"dim1", 1}}));
SB_REGISTER_OP_RULE("contiguous", sb::strategies::contiguousRule());
SB_REGISTER_OP_RULE("split", sb::strategies::splitRule());
