// rms_norm (LLaMA's RMSNorm, weight only, eps 1e-5): the batch dimensions split as layer_norm's
// (ColossalAI's LayerNormGenerator), the hidden dimension kept whole. On a rank's rows the
// executor runs one autograd function whose buffers are few and listed (rmsNormMemory); the
// reference composes LibTorch's operators (reference::rmsNorm).

#include <numeric>

#include <torch/csrc/autograd/custom_function.h>

#include "strategies/sharding/ops/op_rule.h"
#include "strategies/sharding/ops/op_specs_common.h"

namespace sb::strategies {
namespace {

constexpr double kEps = 1e-5;

// y = x * r * w, r = rsqrt(mean(x^2) + eps) per row. Saves x, r and w.
struct RmsNorm : torch::autograd::Function<RmsNorm> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& w) {
    at::Tensor r = (x * x).mean(-1, /*keepdim=*/true);  // + X, + R, - X
    r.add_(kEps).rsqrt_();
    at::Tensor y = x * r;  // + X
    y.mul_(w);
    ctx->save_for_backward({x, r, w});
    return y;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &r = saved[1], &w = saved[2];
    const at::Tensor& g = grads[0];
    std::vector<int64_t> rows(static_cast<size_t>(x.dim() - 1));
    std::iota(rows.begin(), rows.end(), 0);
    at::Tensor xhat = x * r;      // + X
    at::Tensor t = g * xhat;      // + X
    at::Tensor dw = t.sum(rows);  // + W
    t.mul_(w);
    at::Tensor dot = t.mean(-1, /*keepdim=*/true);  // + R
    t.reset();                                      // - X
    at::Tensor dx = g * w;                          // + X
    xhat.mul_(dot);
    dx.sub_(xhat).mul_(r);
    return {dx, dw};  // xhat, dot: - X - R
  }
};

std::vector<OpStrategySpec> rmsNormSpecs(const reference::OpShape& s) {
  std::vector<OpStrategySpec> out = batchSplitNormSpecs(s, 1);
  for (auto& n : out) n.set = "beyond";
  return out;
}

// The allocations RmsNorm's comments list: forward x * x, its mean (r, saved), the product;
// backward xhat, g * xhat, the weight's gradient, the statistic, the input's gradient. What
// the forward saved (r) goes with the node's saved tensors, after it.
void rmsNormMemory(MemoryReplay& m) {
  m.dropPreviousResults(false, false);
  const at::Tensor& x = m.leaves[0];
  const int64_t X = m.X, R = x.numel() / std::max<int64_t>(1, x.size(-1)) * m.es;
  // mean divides by the count: a wrapped integer scalar, cast to the input's type.
  const int64_t cast = m.es;
  const auto mean = [&] {
    m.alloc(R);
    m.alloc(8 + cast);
    m.release(8 + cast);
  };
  m.alloc(X);
  mean();
  m.release(X);
  // + eps in place: the double scalar wrapped, and cast where the input is not double.
  const int64_t epsCast = m.es == 8 ? 0 : m.es;
  m.alloc(8 + epsCast);
  m.release(8 + epsCast);
  m.alloc(m.O);
  m.backwardBegins();
  m.alloc(2 * X);
  m.alloc(m.g[1]);
  mean();
  m.release(X);
  m.alloc(m.g[0]);
  m.release(X + R);
  // The saved r goes with the node, before the gradients' all-reduces (later nodes) run: seen
  // where the weight's all-reduce is the peak (one row a rank, X = W). The plan's replay frees
  // what a node saved itself.
  if (!m.split) m.release(R);
  m.gradAllReduces();
}

OpRule rmsNormRule() {
  OpRule r;
  r.canonicalShapes = [] {
    return std::vector<nlohmann::json>{{{"op", "rms_norm"}, {"input", {4, 16}}}};
  };
  r.specs = rmsNormSpecs;
  r.layouts = keepLayouts;
  r.faults = [](const OpStrategySpec& sp) { return commonFaults(sp, {}); };
  r.forward = [](const LocalForward& f) {
    return std::vector<at::Tensor>{RmsNorm::apply(f.in[0], f.in[1])};
  };
  r.memory = rmsNormMemory;
  r.flops = noFlops;
  r.statistics = noStatistics;
  r.reductionLength = noReduction;
  return r;
}

}  // namespace
}  // namespace sb::strategies

SB_REGISTER_OP_RULE("rms_norm", sb::strategies::rmsNormRule());
