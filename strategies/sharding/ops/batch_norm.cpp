// batch_norm: ColossalAI's BatchNormStrategyGenerator, 4 plain strategies (channels split) and
// 5 SYNC_BN ones (batch split, statistics all-reduced: SplitNorm, PyTorch's SyncBatchNorm).

#include "strategies/sharding/ops/op_rule.h"
#include "strategies/sharding/ops/op_specs_common.h"
#include "strategies/sharding/ops/split_norm.h"

namespace sb::strategies {
namespace {

using Axes = std::vector<int>;

std::vector<OpStrategySpec> batchNormSpecs(const reference::OpShape& s) {
  const int r = static_cast<int>(s.input.size());
  std::vector<OpStrategySpec> out;
  const auto make = [&](const Axes& n, const Axes& c, std::vector<int> meshDims, bool sync) {
    std::vector<Axes> d(r);
    d[0] = n;
    d[1] = c;
    auto sp = spec(
        s, seqOf({n, c}) + " = " + seqOf({n, c}) + " x " + seq(c) + (sync ? " WITH SYNC_BN" : ""),
        {L(d), L({c}), L({c})}, {L(d)}, std::move(meshDims));
    if (sync) sp.variant = "sync";
    // The running statistics are laid out as the weight, as ColossalAI's generator declares
    // them: split with the channels, replicated over a batch split (SYNC_BN).
    sp.buffers = {{"running_mean", L({c})}, {"running_var", L({c})}};
    out.push_back(sp);
  };
  make({}, {0}, {1, 2}, false);
  make({}, {1}, {2}, false);
  make({}, {0, 1}, {2}, false);
  make({}, {}, {1, 2}, false);
  make({0}, {}, {1, 2}, true);
  make({1}, {}, {2}, true);
  make({0, 1}, {}, {2}, true);
  make({0}, {1}, {2}, true);
  make({1}, {0}, {2}, true);
  return out;
}

std::vector<at::Tensor> batchNormForward(const LocalForward& f) {
  const at::Tensor& x = f.in[0];
  const auto& in = f.in;
  if (f.r.spec.variant != "sync") {
    return {at::batch_norm(x, in[1], in[2], {}, {}, true, 0.1, kNormEps, false)};
  }
  // Synchronised statistics over the whole batch (every dimension but the channels).
  std::vector<int64_t> dims = {0}, view(x.dim(), 1);
  for (int64_t d = 2; d < x.dim(); ++d) dims.push_back(d);
  view[1] = x.size(1);
  const int64_t perSample = x.numel() / std::max<int64_t>(1, x.size(0) * x.size(1));
  const double count =
      static_cast<double>((f.statComm ? f.r.shape.input[0] : x.size(0)) * perSample);
  return {SplitNorm::apply(x, in[1], in[2], f.statComm, dims, view, count)};
}

void batchNormMemory(MemoryReplay& m) {
  m.dropPreviousResults(false, false);
  if (m.r.spec.variant == "sync") {
    // SplitNorm, as its comments list its buffers.
    const int64_t RW = m.leaves[0].size(1) * m.es;
    splitNormReplay(m, RW, RW);
    return;
  }
  const int64_t C = m.leaves[0].size(1) * m.statEs;
  m.alloc(4 * C);  // saved mean and inverse deviation, and two temporaries
  m.release(2 * C);
  m.alloc(m.O);
  m.alloc(2 * C);
  m.release(2 * C);
  m.backwardBegins();
  m.alloc(m.sumG);
  m.alloc(m.X);  // a temporary of the input's size
  m.release(m.X + 2 * C);
  m.gradAllReduces();
}

OpRule batchNormRule() {
  OpRule r;
  r.canonicalShapes = [] {
    return std::vector<nlohmann::json>{{{"op", "batch_norm"}, {"input", {8, 4, 6, 6}}}};
  };
  r.specs = batchNormSpecs;
  r.layouts = keepLayouts;
  r.faults = [](const OpStrategySpec& sp) {
    std::vector<std::string> own;
    if (sp.variant == "sync") own.push_back("skip_stats_all_reduce");
    return commonFaults(sp, own);
  };
  r.forward = batchNormForward;
  r.memory = batchNormMemory;
  r.flops = noFlops;
  // One statistic per channel.
  r.statistics = [](const harness::Box& in) { return in.length[1]; };
  r.reductionLength = noReduction;
  return r;
}

}  // namespace
}  // namespace sb::strategies

SB_REGISTER_OP_RULE("batch_norm", sb::strategies::batchNormRule());
