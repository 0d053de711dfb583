// The CUDA kernels against their CPU implementations, on the GPU. Every test skips, saying why,
// where the build has no CUDA kernels or the machine no CUDA device.

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cmath>
#include <limits>

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

}  // namespace
}  // namespace sb::kernels
