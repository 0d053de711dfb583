#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cmath>
#include <limits>

#include "harness/measure/verify.h"

namespace sb::harness {
namespace {

const Tolerance kFp32 = Tolerance::defaultFor(at::kFloat);

TEST(Tolerance, DefaultsAreThoseOfTorchTestingAssertClose) {
  EXPECT_EQ(Tolerance::defaultFor(at::kFloat).rtol, 1.3e-6);
  EXPECT_EQ(Tolerance::defaultFor(at::kFloat).atol, 1e-5);
  EXPECT_EQ(Tolerance::defaultFor(at::kHalf).rtol, 1e-3);
  EXPECT_EQ(Tolerance::defaultFor(at::kHalf).atol, 1e-5);
  EXPECT_EQ(Tolerance::defaultFor(at::kBFloat16).rtol, 1.6e-2);
  EXPECT_EQ(Tolerance::defaultFor(at::kBFloat16).atol, 1e-5);
  EXPECT_EQ(Tolerance::defaultFor(at::kDouble).rtol, 1e-7);
  EXPECT_EQ(Tolerance::defaultFor(at::kDouble).atol, 1e-7);
}

TEST(CheckTensor, EqualTensorsPass) {
  const at::Tensor e = at::randn({8, 8});
  const auto c = checkTensor("output", 0, e.clone(), e, {0, 0}, kFp32);
  EXPECT_TRUE(c.passed());
  EXPECT_EQ(c.mismatches, 0);
  EXPECT_EQ(c.numel, 64);
  EXPECT_EQ(c.maxAbsErr, 0);
}

TEST(CheckTensor, PlantedMismatchesAreCountedAndTheWorstIsLocated) {
  const at::Tensor e = at::ones({4, 5});
  at::Tensor a = e.clone();
  a[1][2] = 1.5;         // worst
  a[3][4] = 1.01;        // also outside 1e-5 + 1.3e-6
  a[0][0] = 1.0 + 5e-6;  // inside the tolerance
  const auto c = checkTensor("grad_weight", 2, a, e, {10, 20}, kFp32);
  EXPECT_FALSE(c.passed());
  EXPECT_EQ(c.mismatches, 2);
  EXPECT_NEAR(c.maxAbsErr, 0.5, 1e-12);
  EXPECT_NEAR(c.maxRelErr, 0.5, 1e-12);
  // Reported in the full tensor's coordinates: local (1, 2) + offset (10, 20).
  EXPECT_EQ(c.worstIndex, (std::vector<int64_t>{11, 22}));
  EXPECT_EQ(c.worstActual, 1.5);
  EXPECT_EQ(c.worstExpected, 1.0);
  EXPECT_NE(c.toString().find("2/20 mismatched"), std::string::npos) << c.toString();
}

TEST(CheckTensor, AnErrorJustPastAtolPlusRtolFails) {
  const at::Tensor e = at::full({1}, 100.0);
  const double bound = 1e-5 + 1.3e-6 * 100.0;
  // fp32 cannot hold 100 + bound exactly; compare in double to stay exact.
  const at::Tensor ed = e.to(at::kDouble);
  const Tolerance tol{1.3e-6, 1e-5, false, ""};
  EXPECT_TRUE(checkTensor("t", 0, ed + 0.9 * bound, ed, {0}, tol).passed());
  EXPECT_FALSE(checkTensor("t", 0, ed + 1.1 * bound, ed, {0}, tol).passed());
}

TEST(CheckTensor, TheErrorRatioIsTheWorstErrorOverItsOwnAllowance) {
  // Allowances: 1e-5 + 1.3e-6 * 100 = 1.4e-4 and 1e-5 + 1.3e-6 * 1 = 1.13e-5; errors 7e-5 and
  // 1.13e-5 give ratios 0.5 and 1.0: the second element is the worst though its error is the
  // smaller one.
  const Tolerance tol{1.3e-6, 1e-5, false, ""};
  const at::Tensor e = at::tensor({100.0, 1.0}, at::kDouble);
  const at::Tensor a = e + at::tensor({7e-5, 1.13e-5}, at::kDouble);
  EXPECT_NEAR(checkTensor("t", 0, a, e, {0}, tol).errRatio, 1.0, 1e-9);
  EXPECT_EQ(checkTensor("t", 0, e.clone(), e, {0}, tol).errRatio, 0.0);
  at::Tensor n = e.clone();
  n[0] = std::nan("");
  EXPECT_TRUE(std::isinf(checkTensor("t", 0, n, e, {0}, tol).errRatio));
  // Bitwise: 0 when equal, infinite on any difference however small.
  const Tolerance bit = Tolerance::bitwise("test");
  EXPECT_EQ(checkTensor("t", 0, e.clone(), e, {0}, bit).errRatio, 0.0);
  EXPECT_TRUE(std::isinf(checkTensor("t", 0, a, e, {0}, bit).errRatio));
}

TEST(CheckTensor, NanIsAMismatchEvenWhenTheReferenceHasNan) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  at::Tensor e = at::zeros({3}, at::kDouble);
  at::Tensor a = e.clone();
  a[1] = nan;
  auto c = checkTensor("t", 0, a, e, {0}, kFp32);
  EXPECT_EQ(c.mismatches, 1);
  EXPECT_TRUE(std::isinf(c.maxAbsErr));
  EXPECT_EQ(c.worstIndex, (std::vector<int64_t>{1}));
  e[1] = nan;
  EXPECT_EQ(checkTensor("t", 0, a, e, {0}, kFp32).mismatches, 1);
  EXPECT_EQ(checkTensor("t", 0, a, e, {0}, Tolerance::bitwise("test")).mismatches, 1);
}

TEST(CheckTensor, InfIsAMismatch) {
  const double inf = std::numeric_limits<double>::infinity();
  at::Tensor e = at::full({2}, inf, at::kDouble);
  EXPECT_EQ(checkTensor("t", 0, e.clone(), e, {0}, kFp32).mismatches, 2);
}

TEST(CheckTensor, BitwiseModeCatchesOneUlpAndSignedZero) {
  const at::Tensor e = at::full({4}, 1.0f);
  at::Tensor a = e.clone();
  a[2] = std::nextafter(1.0f, 2.0f);
  EXPECT_TRUE(checkTensor("t", 0, a, e, {0}, kFp32).passed());
  auto c = checkTensor("t", 0, a, e, {0}, Tolerance::bitwise("exact inputs"));
  EXPECT_EQ(c.mismatches, 1);
  EXPECT_EQ(c.worstIndex, (std::vector<int64_t>{2}));
  at::Tensor z = at::zeros({2});
  at::Tensor nz = -at::zeros({2});
  EXPECT_EQ(checkTensor("t", 0, nz, z, {0}, Tolerance::bitwise("x")).mismatches, 2);
  EXPECT_TRUE(checkTensor("t", 0, nz, z, {0}, kFp32).passed());
}

TEST(CheckTensor, AShapeOrDtypeMismatchOrMissingTensorFailsWithAReason) {
  const at::Tensor e = at::zeros({4, 4});
  auto c = checkTensor("t", 1, at::zeros({4, 3}), e, {0, 0}, kFp32);
  EXPECT_FALSE(c.passed());
  EXPECT_NE(c.problem.find("local shape"), std::string::npos);
  EXPECT_FALSE(checkTensor("t", 1, at::zeros({4, 4}, at::kDouble), e, {0, 0}, kFp32).passed());
  auto m = checkTensor("t", 1, at::Tensor(), e, {0, 0}, kFp32);
  EXPECT_FALSE(m.passed());
  EXPECT_EQ(m.mismatches, 16);
}

TEST(CheckTensor, BFloat16UsesItsOwnWiderTolerance) {
  const at::Tensor e = at::full({4}, 1.0).to(at::kBFloat16);
  const at::Tensor a = at::full({4}, 1.0078125).to(at::kBFloat16);  // one bf16 ulp above 1
  EXPECT_TRUE(checkTensor("t", 0, a, e, {0}, Tolerance::defaultFor(at::kBFloat16)).passed());
  EXPECT_FALSE(checkTensor("t", 0, a, e, {0}, Tolerance::bitwise("x")).passed());
}

}  // namespace
}  // namespace sb::harness

namespace sb::harness {
namespace {

TEST(SplitReductionTolerance, ScalesAtolWithTheSumLengthOnlyWhereTheSumIsSplit) {
  const at::Tensor e = at::full({3}, -8.0);
  const Tolerance fp32 = Tolerance::defaultFor(at::kFloat);
  const Tolerance t = splitReductionTolerance(fp32, at::kFloat, 1024, 4, e);
  EXPECT_DOUBLE_EQ(t.atol, 1024 * std::ldexp(1.0, -24) * 8.0);
  EXPECT_EQ(t.rtol, fp32.rtol);
  EXPECT_NE(t.reason.find("a sum of 1024 split over 4 ranks"), std::string::npos) << t.reason;
  // Not split, bitwise, or already looser: unchanged.
  EXPECT_EQ(splitReductionTolerance(fp32, at::kFloat, 1024, 1, e).atol, fp32.atol);
  EXPECT_TRUE(splitReductionTolerance(Tolerance::bitwise("x"), at::kFloat, 1024, 4, e).exact);
  EXPECT_EQ(splitReductionTolerance(fp32, at::kFloat, 16, 4, e).atol, fp32.atol);
  // A lost partial sum (a quarter of the value missing) stays far outside it.
  EXPECT_FALSE(checkTensor("t", 0, e * 0.75, e, {0}, t).passed());
}

}  // namespace
}  // namespace sb::harness
