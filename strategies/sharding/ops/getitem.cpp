// getitem (`input[i]`, `input[a:b]` on the first dimension): ColossalAI's
// TensorStrategyGenerator. One strategy per layout of the input that keeps the indexed
// dimension whole (ColossalAI replicates it: a rank must hold the rows the index names); the
// other dimensions keep their shards, moved down one place when an integer index drops the
// first. The output is a view of the input; the backward writes the gradient into zeros of the
// input's shape. Nothing is communicated.
//
// The planted fault shards the indexed dimension over the strategy's first axis and lets each
// rank index its own piece as if it were the whole tensor: ranks past the first return other
// rows than the index names.

#include <ATen/ATen.h>

#include <algorithm>

#include "strategies/sharding/ops/op_rule.h"
#include "strategies/sharding/ops/op_specs_common.h"

namespace sb::strategies {
namespace {

using harness::Layout;
using Axes = std::vector<int>;

bool intIndex(const reference::OpShape& s) { return s.attrs.at("index").is_number_integer(); }

// The output's layout for an input laid out as `in` (its first dimension whole).
Layout getitemOutput(const reference::OpShape& s, const Layout& in) {
  std::vector<Axes> d = in.dimAxes();
  if (intIndex(s)) d.erase(d.begin());
  return L(d);
}

std::vector<OpStrategySpec> getitemSpecs(const reference::OpShape& s) {
  return followingSpecs(s, true, [&](const Layout& in) {
    const Layout out = getitemOutput(s, in);
    // ColossalAI: "[output] = [input]_<index>".
    return FollowingOutputs{
        {out}, out.compact() + " = " + in.compact(), colossalSeq(out) + " = " + colossalSeq(in)};
  });
}

// The planted fault: the first dimension sharded over the strategy's first axis, which leaves
// the dimension it sharded.
void getitemLayouts(ResolvedOp& r, const harness::DeviceMesh&) {
  if (r.spec.variant != "fault_getitem") return;
  const int axis = usedAxes(r.operands[0])[0];
  auto dims = r.operands[0].dimAxes();
  for (auto& d : dims) d.erase(std::remove(d.begin(), d.end(), axis), d.end());
  dims[0].push_back(axis);
  r.operands = {Layout(dims, {})};
  // The output as declared: without the first dimension, or (a slice) with its rows whole.
  if (intIndex(r.shape)) {
    dims.erase(dims.begin());
  } else {
    dims[0].clear();
  }
  r.outputs = {Layout(dims, {})};
}

std::vector<at::Tensor> getitemForward(const LocalForward& f) {
  if (f.r.spec.variant != "fault_getitem") return referenceForward(f);
  // Each rank indexes its own piece as if it were the whole first dimension (the rows taken
  // modulo the piece, so that every rank returns the declared shape rather than failing).
  const at::Tensor& x = f.in[0];
  const auto& v = f.r.shape.attrs.at("index");
  const int64_t rows = x.size(0);
  if (v.is_number_integer()) {
    const int64_t i = v.get<int64_t>();
    return {x.select(0, ((i % rows) + rows) % rows)};
  }
  const int64_t start = v[0].get<int64_t>(), stop = v[1].get<int64_t>();
  const at::Tensor picked = at::arange(start, stop, x.options().dtype(at::kLong)).remainder(rows);
  return {x.index_select(0, picked)};
}

OpRule getitemRule() {
  OpRule r;
  r.canonicalShapes = [] {
    return std::vector<nlohmann::json>{{{"op", "getitem"}, {"input", {4, 8, 16}}, {"index", 1}},
                                       {{"op", "getitem"}, {"input", {8, 16}}, {"index", {2, 6}}}};
  };
  r.specs = getitemSpecs;
  r.layouts = getitemLayouts;
  r.faults = [](const OpStrategySpec& sp) {
    std::vector<std::string> own;
    if (!usedAxes(sp.operandLayouts[0]).empty()) own.push_back("index_dim_sharded");
    return commonFaults(sp, own);
  };
  r.forward = getitemForward;
  // The output a view of the input; the backward's zeros of the input's shape, into which it
  // copies the gradient, become the input's gradient.
  r.memory = [](MemoryReplay& m) {
    m.dropPreviousResults(true, false);
    m.backwardBegins();
    m.alloc(m.sumG);
  };
  r.flops = noFlops;
  r.statistics = noStatistics;
  r.reductionLength = noReduction;
  return r;
}

}  // namespace
}  // namespace sb::strategies

SB_REGISTER_OP_RULE("getitem", sb::strategies::getitemRule());
