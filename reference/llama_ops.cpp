// LLaMA's operators as plain LibTorch composes them (ops.h): RMSNorm and the rotary position
// embedding, the references the llama graph and the rms_norm and rope operators are checked
// against.

#include <ATen/ATen.h>

#include "reference/ops.h"

namespace sb::reference {

at::Tensor rmsNorm(const at::Tensor& x, const at::Tensor& weight) {
  return x * at::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + 1e-5) * weight;
}

at::Tensor rotary(const at::Tensor& x, int64_t positionOffset, double theta) {
  const int64_t S = x.size(1), half = x.size(3) / 2;
  const auto opts = x.options().dtype(at::kDouble);
  // Angles in double, then cast: every rank's box of the sequence gets the whole tensor's.
  const at::Tensor inv = at::pow(theta, at::arange(0, half, opts) * (-2.0 / (2 * half)));
  const at::Tensor angle = at::arange(positionOffset, positionOffset + S, opts).unsqueeze(1) * inv;
  const at::Tensor cos = angle.cos().to(x.scalar_type()).view({1, S, 1, half});
  const at::Tensor sin = angle.sin().to(x.scalar_type()).view({1, S, 1, half});
  const at::Tensor x1 = x.narrow(3, 0, half), x2 = x.narrow(3, half, half);
  return at::cat({x1 * cos - x2 * sin, x2 * cos + x1 * sin}, 3);
}

}  // namespace sb::reference
