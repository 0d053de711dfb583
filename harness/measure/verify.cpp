#include "harness/measure/verify.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <string>

#include <ATen/ATen.h>

#include "kernels/error_stats.h"

namespace sb::harness {

Tolerance Tolerance::defaultFor(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat:
      return {1.3e-6, 1e-5, false, ""};
    case at::kDouble:
      return {1e-7, 1e-7, false, ""};
    case at::kHalf:
      return {1e-3, 1e-5, false, ""};
    case at::kBFloat16:
      return {1.6e-2, 1e-5, false, ""};
    default:
      return {0, 0, true, ""};
  }
}

Tolerance Tolerance::bitwise(std::string reason) { return {0, 0, true, std::move(reason)}; }

std::string Tolerance::toString() const {
  std::ostringstream os;
  if (exact) {
    os << "bitwise";
  } else {
    os << "rtol=" << rtol << " atol=" << atol;
  }
  if (!reason.empty()) os << " (" << reason << ")";
  return os.str();
}

double unitRoundoff(at::ScalarType dtype) {
  switch (dtype) {
    case at::kDouble:
      return std::ldexp(1.0, -53);
    case at::kFloat:
      return std::ldexp(1.0, -24);
    case at::kHalf:
      return std::ldexp(1.0, -11);
    case at::kBFloat16:
      return std::ldexp(1.0, -8);
    default:
      return 0;
  }
}

namespace {

double maxAbs(const at::Tensor& t) { return t.numel() ? t.abs().max().item<double>() : 0.0; }

// `base` with atol raised to `atol` and the reason said, or `base` where it is already wider.
Tolerance widened(const Tolerance& base, double atol, const std::string& reason) {
  if (atol <= base.atol) return base;
  Tolerance t = base;
  t.atol = atol;
  t.reason = reason;
  return t;
}

}  // namespace

Tolerance reorderedSumTolerance(const Tolerance& base, at::ScalarType dtype, int64_t length,
                                const at::Tensor& expected) {
  if (base.exact || length <= 1 || !at::isFloatingType(dtype)) return base;
  std::ostringstream os;
  os << "a sum of " << length
     << " terms on one rank, by a kernel that orders it by its own shapes and threads: atol = "
     << length << " * u * max|reference|";
  return widened(base, static_cast<double>(length) * unitRoundoff(dtype) * maxAbs(expected),
                 os.str());
}

Tolerance stepsTolerance(at::ScalarType dtype, int steps, double scale) {
  Tolerance t = Tolerance::defaultFor(dtype);
  const double k = 10.0 * std::max(1, steps);
  t.rtol *= k;
  t.atol = std::max(t.atol * k, k * unitRoundoff(dtype) * scale);
  return t;
}

Tolerance overSteps(const Tolerance& oneStep, at::ScalarType dtype, int steps,
                    const at::Tensor& expected) {
  if (oneStep.exact) return oneStep;
  Tolerance t = stepsTolerance(dtype, steps, maxAbs(expected));
  const double k = 10.0 * std::max(1, steps);
  t.atol = std::max(t.atol, oneStep.atol * k);
  t.rtol = std::max(t.rtol, oneStep.rtol * k);
  t.reason = (oneStep.reason.empty() ? "the dtype's tolerance" : oneStep.reason) +
             "; compounded over " + std::to_string(steps) + " optimizer steps: x 10 x steps";
  return t;
}

Tolerance splitReductionTolerance(const Tolerance& base, at::ScalarType dtype, int64_t length,
                                  int64_t parts, const at::Tensor& expected) {
  // On CUDA even an unsplit product may be summed in another order: cuBLAS picks its kernel
  // (and split-K) by the operands' shapes and layouts, which a strategy changes.
  const bool cublasOrder = parts <= 1 && expected.is_cuda();
  if (base.exact || (parts <= 1 && !cublasOrder) || !at::isFloatingType(dtype)) return base;
  const double u = unitRoundoff(dtype);
  if (u == 0) return base;
  const double scale = maxAbs(expected);
  // cuBLAS accumulates in fp32 (fp64 for double) and rounds the result once: the two orders
  // differ by the accumulation's rounding and one rounding of the output each.
  const double acc = unitRoundoff(dtype == at::kDouble ? at::kDouble : at::kFloat);
  const double atol = cublasOrder ? (2 * u + static_cast<double>(length) * acc) * scale
                                  : static_cast<double>(length) * u * scale;
  std::ostringstream os;
  if (cublasOrder) {
    os << "cuBLAS may add a sum of " << length
       << " in another order for another operand layout: atol = (2 u + " << length
       << " u_acc) * max|reference|";
  } else {
    os << "a sum of " << length << " split over " << parts
       << " ranks is added in another order than the reference's: atol = " << length
       << " * u * max|reference|";
  }
  return widened(base, atol, os.str());
}

Tolerance withReferenceRounding(const Tolerance& tol, double referenceError) {
  if (tol.exact || !(referenceError > 0) || !std::isfinite(referenceError)) return tol;
  const double atol = kReferenceRoundingFactor * referenceError;
  if (atol <= tol.atol) return tol;
  Tolerance t = tol;
  t.atol = atol;
  std::ostringstream os;
  os << "the reference's own rounding: it is " << referenceError
     << " from the same computation in float64, so atol = " << kReferenceRoundingFactor
     << " x that";
  t.reason = tol.reason.empty() ? os.str() : tol.reason + "; raised to " + os.str();
  return t;
}

std::string TensorCheck::toString() const {
  std::ostringstream os;
  os << tensor << "@rank" << rank << ": ";
  if (!problem.empty()) {
    os << problem;
    return os.str();
  }
  os << mismatches << "/" << numel << " mismatched, max_abs_err=" << maxAbsErr
     << " max_rel_err=" << maxRelErr;
  if (!worstIndex.empty()) {
    os << ", worst at [";
    for (size_t i = 0; i < worstIndex.size(); ++i) os << (i ? "," : "") << worstIndex[i];
    os << "] got " << worstActual << " expected " << worstExpected;
  }
  return os.str();
}

TensorCheck checkTensor(const std::string& tensor, int rank, const at::Tensor& actual,
                        const at::Tensor& expected, const std::vector<int64_t>& offset,
                        const Tolerance& tol) {
  TensorCheck c;
  c.tensor = tensor;
  c.rank = rank;
  c.numel = expected.numel();
  c.tolerance = tol.toString();
  if (!actual.defined()) {
    c.problem = "missing (the executor returned no such tensor)";
    c.mismatches = c.numel;
    c.errRatio = std::numeric_limits<double>::infinity();
    return c;
  }
  if (actual.sizes() != expected.sizes()) {
    std::ostringstream os;
    os << "local shape " << actual.sizes() << " but the declared layout holds " << expected.sizes();
    c.problem = os.str();
    c.mismatches = c.numel;
    c.errRatio = std::numeric_limits<double>::infinity();
    return c;
  }
  if (actual.scalar_type() != expected.scalar_type()) {
    std::ostringstream os;
    os << "dtype " << actual.scalar_type() << " but the reference is " << expected.scalar_type();
    c.problem = os.str();
    c.mismatches = c.numel;
    c.errRatio = std::numeric_limits<double>::infinity();
    return c;
  }
  const auto s = kernels::errorStats(actual, expected, tol.rtol, tol.atol, tol.exact);
  c.mismatches = s.mismatches;
  c.maxAbsErr = s.maxAbsErr;
  c.maxRelErr = s.maxRelErr;
  c.errRatio = s.maxErrRatio;
  if (!s.worstIndex.empty()) {
    std::vector<int64_t> local = s.worstIndex;
    // The one element, indexed where the tensors live: no host copy of a device tensor.
    at::Tensor a = actual.detach(), e = expected.detach();
    for (int64_t d : local) {
      a = a[d];
      e = e[d];
    }
    c.worstActual = a.to(at::kCPU, at::kDouble).item<double>();
    c.worstExpected = e.to(at::kCPU, at::kDouble).item<double>();
    c.worstIndex = local;
    for (size_t d = 0; d < offset.size() && d < local.size(); ++d) c.worstIndex[d] += offset[d];
  }
  return c;
}

}  // namespace sb::harness
