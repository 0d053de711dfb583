#include "kernels/error_stats.h"

#include <cmath>
#include <limits>
#include <optional>

#include <ATen/ATen.h>

#include "kernels/cuda_api.h"
#include "kernels/stream.h"

namespace sb::kernels {
namespace {

std::vector<int64_t> unravel(int64_t flat, at::IntArrayRef shape) {
  std::vector<int64_t> index(shape.size());
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    index[d] = shape[d] ? flat % shape[d] : 0;
    flat = shape[d] ? flat / shape[d] : 0;
  }
  return index;
}

at::ScalarType sameWidthInt(at::ScalarType t) {
  switch (c10::elementSize(t)) {
    case 1:
      return at::kByte;
    case 2:
      return at::kShort;
    case 4:
      return at::kInt;
    default:
      return at::kLong;
  }
}

}  // namespace

ErrorStats errorStatsCpu(const at::Tensor& actual, const at::Tensor& expected, double rtol,
                         double atol, bool exact) {
  TORCH_CHECK(actual.sizes() == expected.sizes(),
              "compared tensors differ in shape: ", actual.sizes(), " vs ", expected.sizes());
  ErrorStats s;
  s.numel = actual.numel();
  if (s.numel == 0) return s;

  const at::Tensor a = actual.detach().to(at::kCPU).to(at::kDouble).contiguous().view(-1);
  const at::Tensor e = expected.detach().to(at::kCPU).to(at::kDouble).contiguous().view(-1);
  const at::Tensor diff = (a - e).abs();
  const at::Tensor finite = at::isfinite(a).logical_and(at::isfinite(e));

  at::Tensor bad;
  if (exact) {
    // Bitwise: compare the storage bits of the original dtype, so -0.0 != 0.0 and NaN payloads
    // count; a NaN is still a mismatch even if both sides hold the same one.
    const auto it = sameWidthInt(actual.scalar_type());
    const at::Tensor ab = actual.detach().to(at::kCPU).contiguous().view(it).view(-1);
    const at::Tensor eb = expected.detach().to(at::kCPU).contiguous().view(it).view(-1);
    bad = ab.ne(eb).logical_or(finite.logical_not());
  } else {
    bad = diff.gt(atol + rtol * e.abs()).logical_or(finite.logical_not());
  }
  s.mismatches = bad.sum().item<int64_t>();

  const double inf = std::numeric_limits<double>::infinity();
  // Non-finite differences become +inf so that they dominate the maxima.
  const at::Tensor absErr = at::where(finite, diff, at::full_like(diff, inf));
  const at::Tensor relErr = at::where(diff.eq(0), at::zeros_like(diff), absErr / e.abs());
  s.maxAbsErr = absErr.max().item<double>();
  s.maxRelErr = relErr.max().item<double>();
  if (exact) {
    s.maxErrRatio = s.mismatches > 0 ? inf : 0.0;
  } else {
    const at::Tensor allowed = atol + rtol * e.abs();
    const at::Tensor ratio =
        at::where(absErr.eq(0), at::zeros_like(absErr), absErr / allowed);  // 0/0 is a match
    s.maxErrRatio = ratio.max().item<double>();
  }

  at::Tensor score;
  if (s.mismatches > 0) {
    const at::Tensor excess = exact ? absErr : absErr - (atol + rtol * e.abs());
    // Matching elements score -inf, so a bitwise mismatch with zero numeric difference
    // (-0.0 vs 0.0) still wins.
    score = at::where(bad, excess, at::full_like(excess, -inf));
  } else {
    score = absErr;
  }
  s.worstIndex = unravel(score.argmax().item<int64_t>(), actual.sizes());
  return s;
}

ErrorStats errorStats(const at::Tensor& actual, const at::Tensor& expected, double rtol,
                      double atol, bool exact) {
#ifdef SB_HAVE_CUDA_KERNELS
  // Both on one GPU, in a dtype the kernel reads: one pass on the device, no host copy.
  std::optional<cuda::Dtype> dt;
  switch (actual.scalar_type()) {
    case at::kFloat:
      dt = cuda::Dtype::kFloat32;
      break;
    case at::kDouble:
      dt = cuda::Dtype::kFloat64;
      break;
    case at::kHalf:
      dt = cuda::Dtype::kFloat16;
      break;
    case at::kBFloat16:
      dt = cuda::Dtype::kBFloat16;
      break;
    default:
      break;
  }
  if (dt && actual.is_cuda() && expected.is_cuda() && actual.device() == expected.device() &&
      actual.scalar_type() == expected.scalar_type() && actual.sizes() == expected.sizes()) {
    const at::Tensor a = actual.detach().contiguous(), e = expected.detach().contiguous();
    const auto raw = cuda::errorStats(a.data_ptr(), e.data_ptr(), *dt, a.numel(), rtol, atol, exact,
                                      currentStream(a));
    ErrorStats s;
    s.numel = a.numel();
    s.mismatches = raw.mismatches;
    s.maxAbsErr = raw.maxAbsErr;
    s.maxRelErr = raw.maxRelErr;
    s.maxErrRatio = raw.maxErrRatio;
    if (s.numel > 0) s.worstIndex = unravel(raw.worst, actual.sizes());
    return s;
  }
#endif
  return errorStatsCpu(actual, expected, rtol, atol, exact);
}

}  // namespace sb::kernels
