#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace sb::harness {

// How close a strategy's tensor must be to the reference.
struct Tolerance {
  double rtol = 0;
  double atol = 0;
  bool exact = false;  // bitwise equality
  std::string reason;  // why a strategy overrides the default; empty for defaults

  // torch.testing.assert_close's defaults: fp32 1.3e-6/1e-5, fp16 1e-3/1e-5,
  // bf16 1.6e-2/1e-5, fp64 1e-7/1e-7; integer types exact.
  static Tolerance defaultFor(at::ScalarType dtype);
  static Tolerance bitwise(std::string reason);
  std::string toString() const;
};

// The unit roundoff of a floating dtype (2^-53 double, 2^-24 float, 2^-11 half, 2^-8 bfloat16);
// 0 for other types.
double unitRoundoff(at::ScalarType dtype);

// The tolerance for a tensor that a strategy reduces over a dimension of `length` elements split
// across `parts` ranks, so that its summation order differs from the reference's. The classical
// bound on the rounding of a length-R sum is about R * u * sum|terms| (u: the unit roundoff,
// 2^-24 for fp32, 2^-53 fp64, 2^-11 fp16, 2^-8 bf16); max|reference| stands in for the terms'
// magnitude, so atol = max(default atol, R * u * max|expected|). A lost partial sum or a
// misplaced shard is off by the size of the values themselves and stays far outside it.
// Returns `base` unchanged for bitwise comparisons and, on the CPU, for parts <= 1. On CUDA an
// unsplit product gets (2 u + R * u_acc) * max|expected| (u_acc: cuBLAS's fp32 or fp64
// accumulation), since cuBLAS chooses its summation order by the operands' layout.
Tolerance splitReductionTolerance(const Tolerance& base, at::ScalarType dtype, int64_t length,
                                  int64_t parts, const at::Tensor& expected);

// The tolerance of a tensor that a rank sums from `length` terms on one rank, as the reference
// does, but through a kernel on other shapes (its piece, or the whole tensor on a thread of a
// mesh): CPU kernels pick their blocking, and oneDNN its reduction split, by the shapes and the
// threads, so the same terms are added in another order. Bounded as splitReductionTolerance's
// sum (atol = R * u * max|expected|) with the reason saying so; `base` for bitwise comparisons,
// lengths of 1 and non-float types.
Tolerance reorderedSumTolerance(const Tolerance& base, at::ScalarType dtype, int64_t length,
                                const at::Tensor& expected);

// The tolerance of a value after `steps` optimizer steps whose every gradient was summed in
// another order than the reference's: each step's rounding moves the next step's parameters,
// so the dtype's default widens with the steps taken: rtol x 10 steps, atol = max(atol x 10
// steps, 10 steps x u x `scale`) with `scale` the values' magnitude (max|reference|). What FSDP's
// rows and the golden losses on another host are compared within.
Tolerance stepsTolerance(at::ScalarType dtype, int steps, double scale);
// A one-step tolerance `oneStep` (a split sum's, say) carried over `steps` optimizer steps: the
// larger of stepsTolerance's and oneStep's rtol and atol x 10 steps, its reason saying so.
// `oneStep` itself where it is bitwise (exact inputs keep every step exact).
Tolerance overSteps(const Tolerance& oneStep, at::ScalarType dtype, int steps,
                    const at::Tensor& expected);

// How many times the reference's own rounding a strategy's result may differ from it: the
// strategy's result and the reference are two roundings of one exact value (x), the float64
// shadow's, so |a - r| <= |a - x| + |r - x|; allowing the strategy's rounding up to three times
// the reference's (another summation order, another blocking) gives 4. See docs/results.md.
inline constexpr double kReferenceRoundingFactor = 4.0;

// `tol` with atol raised to kReferenceRoundingFactor x `referenceError` (max |reference - the
// same computation in float64|: what the reference itself lost to rounding, which a tolerance
// scaled by the result understates where the terms cancel: a gradient zero by structure, an
// AdamW step on a gradient that is rounding noise), the reason saying so; `tol` where it is
// bitwise or already wider, or where nothing was measured (referenceError < 0).
Tolerance withReferenceRounding(const Tolerance& tol, double referenceError);

// The comparison of one local tensor of one rank against its slice of the reference.
struct TensorCheck {
  std::string tensor;  // "output", "grad_weight", ...
  int rank = 0;
  int64_t numel = 0;
  int64_t mismatches = 0;
  double maxAbsErr = 0;
  double maxRelErr = 0;
  double errRatio = 0;  // max |a - e| / (atol + rtol |e|): <= 1 passes; +inf for a problem
  std::vector<int64_t> worstIndex;  // in the full tensor's coordinates
  double worstActual = 0;
  double worstExpected = 0;
  std::string tolerance;  // what it was compared with, e.g. "rtol=1.3e-06 atol=1e-05"
  std::string problem;    // set when the tensor could not be compared at all (missing, shape)

  bool passed() const { return problem.empty() && mismatches == 0; }
  std::string toString() const;  // one line, for messages
};

// Compares `actual` with `expected` (the rank's slice of the reference); `offset` maps local
// indices to full-tensor indices for the report. A shape mismatch is a failed check, never an
// exception.
TensorCheck checkTensor(const std::string& tensor, int rank, const at::Tensor& actual,
                        const at::Tensor& expected, const std::vector<int64_t>& offset,
                        const Tolerance& tol);

}  // namespace sb::harness
