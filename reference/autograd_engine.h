#pragma once

#include <vector>

#include <ATen/core/Tensor.h>

namespace torch::autograd {
struct Engine;
}

namespace sb::reference {

// torch::autograd::backward(tensors, grads), run by the autograd engine installed for the
// calling thread (ScopedAutogradEngine) or, where none is, by LibTorch's default engine, which
// is what every CPU case uses. A missing or undefined grad is ones for a one-element tensor, as
// LibTorch's own.
//
// Why an engine per thread: LibTorch's default engine runs the backward of CUDA tensors on one
// thread per device, for every caller. Ranks of the threads backend that share a GPU and
// communicate inside their backward (a sharded operator's gradient all-reduce) would wait for
// each other there forever, one rank's collective blocking the thread the others need; and
// memory allocated there would count against no rank. The harness gives each such rank its
// own engine (harness/device.h).
void backward(const std::vector<at::Tensor>& tensors, const std::vector<at::Tensor>& grads = {});

// Installs `engine` for the calling thread for the scope's lifetime (nullptr: the default).
class ScopedAutogradEngine {
 public:
  explicit ScopedAutogradEngine(torch::autograd::Engine* engine);
  ~ScopedAutogradEngine();
  ScopedAutogradEngine(const ScopedAutogradEngine&) = delete;
  ScopedAutogradEngine& operator=(const ScopedAutogradEngine&) = delete;

 private:
  torch::autograd::Engine* previous_;
};

}  // namespace sb::reference
