#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

namespace sb::kernels {

// Element-wise comparison of `actual` against `expected` (same shape), reduced to the numbers a
// record keeps. An element matches when
//   exact:     its bits are equal;
//   otherwise: both are finite and |actual - expected| <= atol + rtol * |expected|,
// the rule of torch.testing.assert_close, except that NaN and Inf never match (a strategy
// that produces them is wrong even where the reference does too).
struct ErrorStats {
  int64_t numel = 0;
  int64_t mismatches = 0;
  double maxAbsErr = 0;  // +inf if any element is not finite
  double maxRelErr = 0;  // |a - e| / |e|; +inf where e == 0 and a != e
  // How far the worst element is from its tolerance: max |a - e| / (atol + rtol * |e|), so
  // that <= 1 matches and the reports can put every tensor on one scale. Bitwise comparisons
  // give 0 when every element matches and +inf otherwise; non-finite elements give +inf.
  double maxErrRatio = 0;
  // Index of the worst element: the mismatch furthest past its tolerance, or the largest
  // absolute error if every element matches. Empty for empty tensors.
  std::vector<int64_t> worstIndex;
};

// CPU implementation (ATen ops in float64), also the reference for the CUDA kernel.
ErrorStats errorStatsCpu(const at::Tensor& actual, const at::Tensor& expected, double rtol,
                         double atol, bool exact);

// Dispatches on the device of the tensors: the CUDA kernel where built and the tensors live on
// a GPU, the CPU implementation otherwise.
ErrorStats errorStats(const at::Tensor& actual, const at::Tensor& expected, double rtol,
                      double atol, bool exact);

}  // namespace sb::kernels
