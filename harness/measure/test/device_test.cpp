// The device layer on every build: a thread's own autograd engine (what each rank of a CUDA
// case gets) runs its backward with LibTorch's gradients, and without CUDA a case on
// `device: cuda` cannot run and the layer says why. The GPU side is device_gpu_test.cpp.

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/engine.h>

#include "harness/measure/device.h"
#include "reference/autograd_engine.h"
#include "reference/workload.h"

namespace sb::harness {
namespace {

class CountingEngine final : public torch::autograd::Engine {
 public:
  torch::autograd::variable_list execute(const torch::autograd::edge_list& roots,
                                         const torch::autograd::variable_list& inputs,
                                         bool keepGraph, bool createGraph, bool accumulateGrad,
                                         const torch::autograd::edge_list& outputs) override {
    ++calls;
    return Engine::execute(roots, inputs, keepGraph, createGraph, accumulateGrad, outputs);
  }
  int calls = 0;
};

TEST(AutogradEngine, AThreadsOwnEngineRunsItsBackwardWithLibTorchsGradients) {
  const auto opts = at::TensorOptions().dtype(at::kDouble);
  const at::Tensor x = at::randn({5, 4}, opts);
  const at::Tensor g = at::randn({5, 3}, opts);
  at::Tensor w = at::randn({4, 3}, opts).requires_grad_(true);
  const auto step = [&] { return at::matmul(x, w).tanh(); };

  reference::backward({step()}, {g});  // no engine installed: LibTorch's default
  const at::Tensor expected = w.grad().clone();
  w.mutable_grad() = at::Tensor();

  // Leaked on purpose, as the harness's: an engine's device threads outlive it otherwise.
  auto* engine = new CountingEngine();
  {
    reference::ScopedAutogradEngine scope(engine);
    reference::backward({step()}, {g});
  }
  EXPECT_EQ(engine->calls, 1);
  EXPECT_TRUE(at::equal(w.grad(), expected));

  // Outside the scope the default engine again; a one-element root gets ones, as LibTorch's.
  w.mutable_grad() = at::Tensor();
  reference::backward({step().sum()});
  EXPECT_EQ(engine->calls, 1);
  {
    reference::ScopedAutogradEngine scope(engine);
    const at::Tensor viaEngine = w.grad().clone();
    w.mutable_grad() = at::Tensor();
    reference::backward({step().sum()});
    EXPECT_EQ(engine->calls, 2);
    EXPECT_TRUE(at::equal(w.grad(), viaEngine));
    // LibTorch's own refusals, with its words.
    try {
      reference::backward({step()});
      ADD_FAILURE() << "a 5x3 root without a gradient was accepted";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("only for scalar outputs"), std::string::npos)
          << e.what();
    }
    EXPECT_THROW(reference::backward({x}), c10::Error);
  }
}

TEST(Device, WithoutCudaTheReasonIsGiven) {
  std::string why;
  if (cudaUsable(&why)) GTEST_SKIP() << "this process has CUDA: device_gpu_test.cpp covers it";
  EXPECT_FALSE(why.empty());
  EXPECT_EQ(cudaDeviceCount(), 0);
  EXPECT_FALSE(installCudaMemoryTracking(&why));
  // On the CPU the per-rank scope and the step timer are the host's.
  reference::setCaseDevice(at::kCPU);
  RankDeviceScope scope(0);
  StepTimer timer;
  timer.start();
  const double s = timer.stopSeconds();
  EXPECT_GE(s, 0.0);
  EXPECT_LT(s, 1.0);
}

}  // namespace
}  // namespace sb::harness
