// The CUDA kernels against their CPU implementations, on the GPU. Every test skips, saying why,
// where the build has no CUDA kernels or the machine no CUDA device. The tensors are made on the
// host and copied to raw device memory, so that a CPU-only LibTorch runs these tests too.

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <tuple>

#include "kernels/attention.h"
#include "kernels/cuda_api.h"
#include "kernels/error_stats.h"
#include "kernels/pack.h"

namespace sb::kernels {
namespace {

class CudaKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!cuda::available(&why)) GTEST_SKIP() << why;
  }
};

// A host tensor's bytes on the device; freed with the guard.
struct DeviceCopy {
  explicit DeviceCopy(const at::Tensor& t) : bytes(t.nbytes()) {
    const at::Tensor c = t.contiguous();
    ptr = cuda::deviceAlloc(bytes);
    cuda::copyToDevice(ptr, c.data_ptr(), bytes);
  }
  ~DeviceCopy() { cuda::deviceFree(ptr); }
  void* ptr;
  int64_t bytes;
};

cuda::Dtype dtypeOf(at::ScalarType t) {
  switch (t) {
    case at::kDouble:
      return cuda::Dtype::kFloat64;
    case at::kHalf:
      return cuda::Dtype::kFloat16;
    case at::kBFloat16:
      return cuda::Dtype::kBFloat16;
    default:
      return cuda::Dtype::kFloat32;
  }
}

void expectSameStats(const at::Tensor& actual, const at::Tensor& expected, double rtol, double atol,
                     bool exact) {
  const ErrorStats cpu = errorStatsCpu(actual, expected, rtol, atol, exact);
  DeviceCopy a(actual), e(expected);
  const auto gpu = cuda::errorStats(a.ptr, e.ptr, dtypeOf(actual.scalar_type()), actual.numel(),
                                    rtol, atol, exact);
  EXPECT_EQ(gpu.mismatches, cpu.mismatches);
  const auto same = [](double x, double y) { return (std::isnan(x) && std::isnan(y)) || x == y; };
  EXPECT_TRUE(same(gpu.maxAbsErr, cpu.maxAbsErr)) << gpu.maxAbsErr << " vs " << cpu.maxAbsErr;
  EXPECT_TRUE(same(gpu.maxRelErr, cpu.maxRelErr)) << gpu.maxRelErr << " vs " << cpu.maxRelErr;
  EXPECT_TRUE(same(gpu.maxErrRatio, cpu.maxErrRatio))
      << gpu.maxErrRatio << " vs " << cpu.maxErrRatio;
  int64_t flat = 0;
  for (size_t d = 0; d < cpu.worstIndex.size(); ++d)
    flat = flat * actual.size(d) + cpu.worstIndex[d];
  EXPECT_EQ(gpu.worst, flat);
}

TEST_F(CudaKernels, ErrorStatsMatchTheCpuOnPlantedMismatchesInEveryFloatingType) {
  for (auto dtype : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16}) {
    const at::Tensor expected = at::randn({300000}, at::kFloat).to(dtype);
    at::Tensor actual = expected.clone();
    actual[12345] += 1.0;
    actual[299999] -= 0.5;
    expectSameStats(actual, expected, 1.3e-6, 1e-5, false);
    expectSameStats(expected, expected, 1.3e-6, 1e-5, false);  // all match: worst = largest error
  }
}

TEST_F(CudaKernels, NaNAndInfAreMismatchesAsOnTheCpu) {
  const at::Tensor expected = at::randn({4097}, at::kFloat);
  at::Tensor actual = expected.clone();
  actual[7] = std::numeric_limits<float>::quiet_NaN();
  actual[4000] = std::numeric_limits<float>::infinity();
  expectSameStats(actual, expected, 1.3e-6, 1e-5, false);
  expectSameStats(actual, actual, 0, 0, true);  // the same NaN is still a mismatch
}

TEST_F(CudaKernels, ExactModeComparesBitsSoNegativeZeroDiffers) {
  const at::Tensor expected = at::zeros({1000}, at::kFloat);
  at::Tensor actual = expected.clone();
  actual[999] = -0.0f;
  expectSameStats(actual, expected, 0, 0, true);
}

TEST_F(CudaKernels, PackingBoxesMatchesTheCpu) {
  const at::Tensor t = at::randn({7, 5, 3}, at::kFloat);
  const std::vector<Region> regions = {
      {{4, 0, 0}, {3, 5, 3}}, {{0, 2, 1}, {4, 3, 2}}, {{1, 1, 0}, {0, 2, 3}}};
  at::Tensor expected = at::empty({3 * 5 * 3 + 4 * 3 * 2}, at::kFloat);
  packRegionsCpu(t, regions, expected);
  const std::vector<cuda::BoxView> views = boxViews(t, regions);
  DeviceCopy src(t), out(expected);
  cuda::packBoxes(src.ptr, out.ptr, views.data(), static_cast<int>(views.size()), 4, false);
  at::Tensor got = at::empty_like(expected);
  cuda::copyToHost(got.data_ptr(), out.ptr, got.nbytes());
  EXPECT_TRUE(at::equal(got, expected));
  // And back into a zeroed tensor.
  DeviceCopy back(at::zeros_like(t));
  cuda::packBoxes(back.ptr, out.ptr, views.data(), static_cast<int>(views.size()), 4, true);
  at::Tensor restored = at::empty_like(t);
  cuda::copyToHost(restored.data_ptr(), back.ptr, restored.nbytes());
  at::Tensor want = at::zeros_like(t);
  unpackRegionsCpu(expected, want, regions);
  EXPECT_TRUE(at::equal(restored, want));
}

// The attention kernel on device copies of host tensors. The outputs start as NaN, so that an
// element the kernel never writes is a mismatch.
AttentionResult attentionOnDevice(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  bool causal, double scale) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  AttentionResult r{at::full_like(q, nan), at::full({q.size(0), q.size(1), q.size(2)}, nan)};
  DeviceCopy dq(q), dk(k), dv(v), out(r.out), lse(r.lse);
  cuda::attentionForward(dq.ptr, dk.ptr, dv.ptr, out.ptr, static_cast<float*>(lse.ptr),
                         dtypeOf(q.scalar_type()), q.size(0) * q.size(1), q.size(2), k.size(2),
                         q.size(3), causal, scale);
  cuda::copyToHost(r.out.data_ptr(), out.ptr, r.out.nbytes());
  cuda::copyToHost(r.lse.data_ptr(), lse.ptr, r.lse.nbytes());
  return r;
}

std::string describe(const ErrorStats& s) {
  return std::to_string(s.mismatches) + " of " + std::to_string(s.numel) +
         " elements off, max abs err " + std::to_string(s.maxAbsErr) + ", worst at " +
         std::to_string(s.maxErrRatio) + "x the tolerance";
}

// Tolerances of the kernel against the CPU walk. Both compute in float32 from the same inputs
// and differ in summation order only. float32 outputs: worst seen on an H100 5.7e-7 (about 10
// unit roundoffs; at B=2 H=16 T=2048 D=128), so 2e-6 relative plus 2e-6 absolute, 3.5x room.
// bfloat16 outputs are those float32 numbers rounded: where the two straddle a rounding boundary
// they are one bfloat16 ulp apart, up to 2^-7 relative (seen: exactly that), so 2^-6 relative,
// plus the float32 2e-6 absolute for outputs near 0. lse is float32 for both dtypes, |lse| < 16
// here: worst seen 9.5e-7, one ulp at 8, so 4e-6 absolute.
constexpr double kFloat32Tol = 2e-6;
constexpr double kBFloat16Rtol = 1.0 / 64;
constexpr double kLseAtol = 4e-6;

void expectAttentionMatches(const AttentionResult& gpu, const AttentionResult& cpu) {
  const bool bf16 = cpu.out.scalar_type() == at::kBFloat16;
  const ErrorStats out =
      errorStatsCpu(gpu.out, cpu.out, bf16 ? kBFloat16Rtol : kFloat32Tol, kFloat32Tol, false);
  EXPECT_EQ(out.mismatches, 0) << "out: " << describe(out);
  // A row that sees no key has lse -inf on both sides; the rest are compared.
  const at::Tensor noKey = cpu.lse.isneginf();
  EXPECT_TRUE(at::equal(gpu.lse.isneginf(), noKey)) << "the rows without keys differ";
  const ErrorStats lse =
      errorStatsCpu(gpu.lse.masked_select(noKey.logical_not()),
                    cpu.lse.masked_select(noKey.logical_not()), 0, kLseAtol, false);
  EXPECT_EQ(lse.mismatches, 0) << "lse: " << describe(lse);
}

struct AttentionShape {
  const char* name;
  int64_t b, h, tq, tk, d;
};
void PrintTo(const AttentionShape& s, std::ostream* os) { *os << s.name; }

const AttentionShape kAttentionShapes[] = {
    {"OddLengthsHeadDim64", 2, 3, 77, 130, 64}, {"OddLengthsHeadDim128", 2, 3, 77, 130, 128},
    {"MoreQueriesThanKeys", 1, 2, 130, 77, 64},  // causal: the first 53 rows see no key
    {"WholeTiles", 2, 2, 128, 192, 32},         {"HeadDimNotAPowerOfTwo", 2, 1, 5, 300, 80},
    {"OneQueryOneKeyOneDim", 1, 1, 1, 1, 1},
};

class CudaAttention
    : public ::testing::TestWithParam<std::tuple<AttentionShape, bool, at::ScalarType>> {
 protected:
  void SetUp() override {
    std::string why;
    if (!cuda::available(&why)) GTEST_SKIP() << why;
  }
};

TEST_P(CudaAttention, KernelMatchesTheCpuWalk) {
  const auto& [shape, causal, dtype] = GetParam();
  at::manual_seed(5);
  const at::Tensor q = at::randn({shape.b, shape.h, shape.tq, shape.d}).to(dtype);
  const at::Tensor k = at::randn({shape.b, shape.h, shape.tk, shape.d}).to(dtype);
  const at::Tensor v = at::randn({shape.b, shape.h, shape.tk, shape.d}).to(dtype);
  const double scale = 1.0 / std::sqrt(static_cast<double>(shape.d));
  expectAttentionMatches(attentionOnDevice(q, k, v, causal, scale),
                         onlineSoftmaxAttentionCpu(q, k, v, 32, causal, scale));
}

std::string attentionCaseName(const ::testing::TestParamInfo<CudaAttention::ParamType>& info) {
  const auto& [shape, causal, dtype] = info.param;
  return std::string(shape.name) + (causal ? "_Causal" : "_Full") +
         (dtype == at::kFloat ? "_Float32" : "_BFloat16");
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaAttention,
                         ::testing::Combine(::testing::ValuesIn(kAttentionShapes),
                                            ::testing::Bool(),
                                            ::testing::Values(at::kFloat, at::kBFloat16)),
                         attentionCaseName);

TEST_F(CudaKernels, AttentionMatchesTheCpuWalkAtTrainingSize) {
  const int64_t b = 2, h = 16, t = 2048, d = 128;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    for (bool causal : {false, true}) {
      SCOPED_TRACE(std::string(c10::toString(dtype)) + (causal ? " causal" : " full"));
      at::manual_seed(6);
      const at::Tensor q = at::randn({b, h, t, d}).to(dtype);
      const at::Tensor k = at::randn({b, h, t, d}).to(dtype);
      const at::Tensor v = at::randn({b, h, t, d}).to(dtype);
      expectAttentionMatches(attentionOnDevice(q, k, v, causal, scale),
                             onlineSoftmaxAttentionCpu(q, k, v, 512, causal, scale));

      // A rough time, for the log only: kernels on the default stream, a copy back to wait.
      DeviceCopy dq(q), dk(k), dv(v), out(q), lse(at::empty({b, h, t}));
      const auto launch = [&] {
        cuda::attentionForward(dq.ptr, dk.ptr, dv.ptr, out.ptr, static_cast<float*>(lse.ptr),
                               dtypeOf(dtype), b * h, t, t, d, causal, scale);
      };
      float sink = 0;
      launch();
      cuda::copyToHost(&sink, lse.ptr, sizeof(sink));
      const int reps = 10;
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < reps; ++i) launch();
      cuda::copyToHost(&sink, lse.ptr, sizeof(sink));
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count() /
          reps;
      const double flops = 4.0 * b * h * t * t * d * (causal ? 0.5 : 1.0);
      std::printf("attention B=%lld H=%lld T=%lld D=%lld %s %s: %.3f ms, %.1f TFLOP/s\n",
                  static_cast<long long>(b), static_cast<long long>(h), static_cast<long long>(t),
                  static_cast<long long>(d), c10::toString(dtype), causal ? "causal" : "full", ms,
                  flops / ms / 1e9);
    }
  }
}

TEST_F(CudaKernels, TheAttentionDispatcherRunsTheKernelOnCudaTensors) {
  if (!at::hasCUDA()) GTEST_SKIP() << "this LibTorch has no CUDA, so it makes no CUDA tensors";
  at::manual_seed(7);
  const at::Tensor q = at::randn({2, 3, 77, 64}), k = at::randn({2, 3, 130, 64});
  const at::Tensor v = at::randn({2, 3, 130, 64});
  const AttentionResult gpu =
      onlineSoftmaxAttention(q.to(at::kCUDA), k.to(at::kCUDA), v.to(at::kCUDA), 32, true, 0.125);
  ASSERT_TRUE(gpu.out.is_cuda());
  ASSERT_TRUE(gpu.lse.is_cuda());
  expectAttentionMatches({gpu.out.cpu(), gpu.lse.cpu()},
                         onlineSoftmaxAttentionCpu(q, k, v, 32, true, 0.125));
}

TEST_F(CudaKernels, AttentionRefusesHeadDimsAbove128AndOtherDtypes) {
  EXPECT_THROW(cuda::attentionForward(nullptr, nullptr, nullptr, nullptr, nullptr,
                                      cuda::Dtype::kFloat32, 1, 1, 1, 129, false, 1.0),
               std::invalid_argument);
  EXPECT_THROW(cuda::attentionForward(nullptr, nullptr, nullptr, nullptr, nullptr,
                                      cuda::Dtype::kFloat64, 1, 1, 1, 64, false, 1.0),
               std::invalid_argument);
}

}  // namespace
}  // namespace sb::kernels
