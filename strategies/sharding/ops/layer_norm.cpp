// layer_norm: ColossalAI's LayerNormGenerator (batch dimensions only, 4 strategies for (4, 16))
// and, beyond it, the hidden dimension split with its statistics all-reduced (SplitNorm).

#include <ATen/Parallel.h>

#include <numeric>

#include "strategies/sharding/ops/op_rule.h"
#include "strategies/sharding/ops/op_specs_common.h"
#include "strategies/sharding/ops/split_norm.h"

namespace sb::strategies {
namespace {

using Axes = std::vector<int>;

std::vector<OpStrategySpec> layerNormSpecs(const reference::OpShape& s) {
  const int r = static_cast<int>(s.input.size());
  std::vector<OpStrategySpec> out = batchSplitNormSpecs(s, 2);
  // ColossalAI: "[out] = [input] x [weight]" (the bias not named), but its unsplit strategy
  // is spelled by hand.
  for (auto& n : out) {
    if (usedAxes(n.operandLayouts[0]).empty()) n.colossalName = "RR = RR x R";
  }
  // Beyond ColossalAI: the hidden dimension split, statistics all-reduced; alone and with a
  // batch split on the other axis.
  std::vector<std::pair<Axes, Axes>> hidden = {{{}, {0}}, {{}, {1}}, {{}, {0, 1}}};
  if (r >= 2) {
    hidden.push_back({{0}, {1}});
    hidden.push_back({{1}, {0}});
  }
  for (const auto& [b, h] : hidden) {
    std::vector<Axes> d(r);
    if (!b.empty()) d[0] = b;
    d[r - 1] = h;
    const bool oneD = b.empty() && h == Axes{0};
    auto sp =
        spec(s, seqOf(d) + " = " + seqOf(d) + " x " + seq(h) + " x " + seq(h),
             {L(d), L({h}), L({h})}, {L(d)}, oneD ? std::vector<int>{1, 2} : std::vector<int>{2});
    sp.colossalName = colossalSeq(L(d)) + " = " + colossalSeq(L(d)) + " x " + colossalSeq(L({h}));
    sp.set = "beyond";
    sp.variant = "hidden";
    out.push_back(sp);
  }
  return out;
}

std::vector<at::Tensor> layerNormForward(const LocalForward& f) {
  const at::Tensor& x = f.in[0];
  const auto& in = f.in;
  if (f.r.spec.variant != "hidden") {
    return {at::layer_norm(x, {x.size(-1)}, in[1], in[2], kNormEps)};
  }
  // Statistics over the whole hidden dimension; with the planted fault, over this rank's
  // piece only.
  const double h = static_cast<double>(f.statComm ? f.r.shape.input.back() : x.size(-1));
  return {SplitNorm::apply(x, in[1], in[2], f.statComm, std::vector<int64_t>{x.dim() - 1},
                           std::vector<int64_t>{x.size(-1)}, h)};
}

void layerNormMemory(MemoryReplay& m) {
  m.dropPreviousResults(false, false);
  if (m.r.statAxes.empty() && m.r.spec.variant != "hidden") {
    const int64_t rows = m.n / std::max<int64_t>(1, m.leaves[0].size(-1));
    const int64_t R = rows * m.es;
    // The kernel's per-thread buffer for the weight and bias gradients.
    const int64_t buffer = 2 * at::get_num_threads() * m.leaves[0].size(-1) * m.es;
    m.alloc(m.O + 2 * R);
    m.backwardBegins();
    m.alloc(m.sumG + buffer);
    m.release(buffer + 2 * R);
    m.gradAllReduces();
  } else {
    // SplitNorm, as its comments list its buffers.
    const at::Tensor& x = m.leaves[0];
    splitNormReplay(m, x.numel() / std::max<int64_t>(1, x.size(-1)) * m.es, x.size(-1) * m.es);
  }
}

OpRule layerNormRule() {
  OpRule r;
  r.canonicalShapes = [] {
    return std::vector<nlohmann::json>{{{"op", "layer_norm"}, {"input", {4, 16}}}};
  };
  r.specs = layerNormSpecs;
  r.layouts = keepLayouts;
  r.faults = [](const OpStrategySpec& sp) {
    std::vector<std::string> own;
    if (sp.variant == "hidden") own.push_back("skip_stats_all_reduce");
    return commonFaults(sp, own);
  };
  r.forward = layerNormForward;
  r.memory = layerNormMemory;
  r.flops = noFlops;
  // One statistic per row.
  r.statistics = [](const harness::Box& in) { return in.numel() / in.length.back(); };
  r.reductionLength = noReduction;
  return r;
}

}  // namespace
}  // namespace sb::strategies

SB_REGISTER_OP_RULE("layer_norm", sb::strategies::layerNormRule());
