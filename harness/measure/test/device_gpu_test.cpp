// The device layer on a GPU (label gpu; every test skips, saying why, without CUDA): ranks of
// the threads backend that share one GPU, each on its own stream with its own autograd engine,
// communicating inside their backward; per-rank CUDA memory through the allocator's hook; CUDA
// event timing.

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <chrono>

#include "harness/comm/autograd_comm.h"
#include "harness/comm/threads_backend.h"
#include "harness/measure/device.h"
#include "harness/measure/memory.h"
#include "reference/autograd_engine.h"
#include "reference/workload.h"

namespace sb::harness {
namespace {

class CudaHarness : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!cudaUsable(&why)) GTEST_SKIP() << "no CUDA: " << why;
    MemoryTracker::instance().install();
    ASSERT_TRUE(installCudaMemoryTracking(&why)) << why;
    reference::setCaseDevice(at::Device(at::kCUDA, currentCudaDevice()));
  }
  void TearDown() override { reference::setCaseDevice(at::kCPU); }
  static at::TensorOptions cuda() { return reference::caseOptions(at::kFloat); }
};

// Rank r's loss is (r + 1) * sum(x): the all-reduce in backward sums 1 + 2 into every x.grad.
void allReduceInBackward(RankContext& ctx, std::vector<at::Tensor>& grads) {
  at::Tensor x = at::full({1 << 16}, 1.0, reference::caseOptions(at::kFloat)).requires_grad_(true);
  const at::Tensor y = identityFwdAllReduceBwd(x, ctx.world()) * (ctx.rank() + 1.0);
  reference::backward({y.sum()});
  grads[ctx.rank()] = x.grad();
}

TEST_F(CudaHarness, RanksSharingAGpuAllReduceInsideTheirBackward) {
  ThreadsOptions o;
  o.timeout = std::chrono::seconds(20);
  ThreadsWorld world(DeviceMesh({2}), o);
  std::vector<at::Tensor> grads(2);
  world.run([&](RankContext& ctx) { allReduceInBackward(ctx, grads); });
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(grads[r].is_cuda());
    EXPECT_TRUE(at::equal(grads[r].cpu(), at::full({1 << 16}, 3.0))) << "rank " << r;
  }
}

// The planted fault: the same ranks on LibTorch's default engine, whose one CUDA device thread
// runs both ranks' backward. Rank 0's all-reduce blocks that thread waiting for rank 1, whose
// backward is queued behind it: the collective times out instead of finishing.
TEST_F(CudaHarness, OnTheSharedDefaultEngineTheSameRanksDeadlock) {
  ThreadsOptions o;
  o.timeout = std::chrono::seconds(3);
  ThreadsWorld world(DeviceMesh({2}), o);
  std::vector<at::Tensor> grads(2);
  try {
    world.run([&](RankContext& ctx) {
      reference::ScopedAutogradEngine defaultEngine(nullptr);
      allReduceInBackward(ctx, grads);
    });
    ADD_FAILURE() << "two ranks communicated inside backward on one shared device thread";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("waited more than"), std::string::npos) << e.what();
  }
}

TEST_F(CudaHarness, EachRanksAllocationsCountAgainstItBackwardIncluded) {
  ThreadsWorld world(DeviceMesh({2}));
  auto& m = MemoryTracker::instance();
  std::vector<int64_t> peak(2), kept(2), start(2);
  std::vector<at::Tensor> hold(2);
  world.run([&](RankContext& ctx) {
    const int r = ctx.rank();
    start[r] = m.current(r);
    m.resetPeak(r);
    const int64_t n = (r + 1) << 18;  // (r + 1) MiB of float32
    at::Tensor x = at::ones({n}, cuda()).requires_grad_(true);
    {
      at::Tensor tmp = at::empty({n}, cuda());  // freed at once: in the peak only
    }
    reference::backward({(x * 2.0).sum()});  // x.grad: made on the rank's engine thread
    hold[r] = x;
    peak[r] = m.peak(r) - start[r];
    kept[r] = m.current(r) - start[r];
  });
  for (int r = 0; r < 2; ++r) {
    const int64_t mib = (int64_t{r} + 1) << 20;
    // Live: x and its gradient. The peak holds x and tmp, or x, x * 2's ones and the gradient.
    EXPECT_EQ(kept[r], 2 * mib) << "rank " << r;
    EXPECT_GE(peak[r], 2 * mib) << "rank " << r;
    EXPECT_LE(peak[r], 4 * mib) << "rank " << r;
  }
  EXPECT_GT(cudaAllocationsSeen(), 0);
}

TEST_F(CudaHarness, StepTimerTimesTheQueuedWorkNotItsLaunch) {
  const at::Tensor a = at::randn({4096, 4096}, cuda());
  synchronizeDevice();  // made on the default stream; read on rank 0's
  RankDeviceScope scope(0);
  (void)at::matmul(a, a);  // warm-up: cuBLAS handle and workspace
  StepTimer timer;
  const auto t0 = std::chrono::steady_clock::now();
  timer.start();
  at::Tensor c;
  for (int i = 0; i < 20; ++i) c = at::matmul(a, a);
  const double events = timer.stopSeconds();
  const double host = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // 20 fp32 products of 4096^3 are 2.7 TFLOP: milliseconds on any GPU, far more than the launches.
  EXPECT_GT(events, 1e-3);
  EXPECT_LE(events, host * 1.05);
  EXPECT_GT(events, host * 0.5);
}

}  // namespace
}  // namespace sb::harness
