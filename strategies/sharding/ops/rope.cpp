// rope (LLaMA's rotary position embedding of [batch, seq, heads, head_dim]): every layout of
// its input that keeps head_dim whole (the rotation pairs a head's two halves), the output laid
// out alike. A rank's box of the sequence is rotated by its own positions. The executor runs
// one autograd function whose buffers are few and listed (ropeMemory); the reference composes
// LibTorch's operators (reference::rotary).

#include <cmath>

#include <torch/csrc/autograd/custom_function.h>

#include "strategies/sharding/ops/op_rule.h"
#include "strategies/sharding/ops/op_specs_common.h"

namespace sb::strategies {
namespace {

// cos and sin of pos * theta^(-2i / head_dim), [1, S, 1, head_dim / 2], in x's type: computed
// in double on the host, one allocation each.
std::pair<at::Tensor, at::Tensor> ropeTables(const at::Tensor& x, int64_t offset, double theta) {
  const int64_t S = x.size(1), half = x.size(3) / 2;
  std::vector<double> c(static_cast<size_t>(S * half)), s(c.size());
  for (int64_t p = 0; p < S; ++p) {
    for (int64_t i = 0; i < half; ++i) {
      const double a = static_cast<double>(offset + p) *
                       std::pow(theta, static_cast<double>(i) * (-2.0 / (2.0 * half)));
      c[p * half + i] = std::cos(a);
      s[p * half + i] = std::sin(a);
    }
  }
  const auto opts = at::TensorOptions().dtype(at::kDouble);
  at::Tensor cos = at::empty({1, S, 1, half}, x.options());
  cos.copy_(at::from_blob(c.data(), {1, S, 1, half}, opts));
  at::Tensor sin = at::empty({1, S, 1, half}, x.options());
  sin.copy_(at::from_blob(s.data(), {1, S, 1, half}, opts));
  return {cos, sin};
}

// out1 = x1 cos - x2 sin, out2 = x2 cos + x1 sin; the backward rotates the gradient back.
at::Tensor rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                  double direction) {
  const int64_t half = x.size(3) / 2;
  const at::Tensor x1 = x.narrow(3, 0, half), x2 = x.narrow(3, half, half);
  at::Tensor out = at::empty_like(x, at::MemoryFormat::Contiguous);  // + X
  at::Tensor o1 = out.narrow(3, 0, half), o2 = out.narrow(3, half, half);
  at::mul_out(o1, x1, cos);
  o1.sub_(x2 * sin, direction);  // + X / 2, - X / 2
  at::mul_out(o2, x2, cos);
  o2.add_(x1 * sin, direction);  // + X / 2, - X / 2
  return out;
}

struct Rope : torch::autograd::Function<Rope> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            int64_t offset, double theta) {
    ctx->saved_data["offset"] = offset;
    ctx->saved_data["theta"] = theta;
    const auto [cos, sin] = ropeTables(x, offset, theta);
    return rotate(x, cos, sin, 1.0);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor g = grads[0].contiguous();
    const auto [cos, sin] =
        ropeTables(g, ctx->saved_data["offset"].toInt(), ctx->saved_data["theta"].toDouble());
    return {rotate(g, cos, sin, -1.0), at::Tensor(), at::Tensor()};
  }
};

// The tables (two of [S, head_dim / 2]), the output and the half-size products, forward and
// backward alike.
void ropeMemory(MemoryReplay& m) {
  m.dropPreviousResults(false, false);
  const at::Tensor& x = m.leaves[0];
  const int64_t T = x.size(1) * (x.size(3) / 2) * m.es, X = m.X;
  const auto rotation = [&](int64_t out) {
    m.alloc(2 * T);
    m.alloc(out);
    for (int k = 0; k < 2; ++k) {
      m.alloc(X / 2);
      m.release(X / 2);
    }
    m.release(2 * T);
  };
  rotation(m.O);
  m.backwardBegins();
  rotation(m.sumG);
}

std::vector<OpStrategySpec> ropeSpecs(const reference::OpShape& s) {
  std::vector<OpStrategySpec> out = followingSpecs(s, true, sameLayout);
  for (auto& sp : out) sp.set = "beyond";
  return out;
}

OpRule ropeRule() {
  OpRule r;
  r.canonicalShapes = [] {
    return std::vector<nlohmann::json>{{{"op", "rope"}, {"input", {2, 8, 4, 16}}}};
  };
  r.specs = ropeSpecs;
  r.layouts = keepLayouts;
  r.faults = [](const OpStrategySpec& sp) { return commonFaults(sp, {}); };
  r.forward = [](const LocalForward& f) {
    const int64_t offset = f.operandBox(0).offset[1];
    return std::vector<at::Tensor>{Rope::apply(f.in[0], offset, f.r.shape.theta())};
  };
  r.memory = ropeMemory;
  r.flops = noFlops;
  r.statistics = noStatistics;
  r.reductionLength = noReduction;
  return r;
}

}  // namespace
}  // namespace sb::strategies

SB_REGISTER_OP_RULE("rope", sb::strategies::ropeRule());
