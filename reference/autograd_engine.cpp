#include "reference/autograd_engine.h"

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/variable.h>

namespace sb::reference {
namespace {

thread_local torch::autograd::Engine* tlsEngine = nullptr;

}  // namespace

void backward(const std::vector<at::Tensor>& tensors, const std::vector<at::Tensor>& grads) {
  if (!tlsEngine) {
    torch::autograd::backward(tensors, grads);
    return;
  }
  // torch::autograd::backward's own steps (autograd.cpp: _make_grads, run_backward), for the
  // engine installed here: the roots' gradient edges and their incoming gradients.
  TORCH_CHECK(grads.empty() || grads.size() == tensors.size(), "backward: got ", grads.size(),
              " gradients for ", tensors.size(), " tensors");
  torch::autograd::edge_list roots;
  torch::autograd::variable_list inputs;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    TORCH_CHECK(t.requires_grad(), "element ", i,
                " of tensors does not require grad and does not have a grad_fn");
    roots.push_back(torch::autograd::impl::gradient_edge(t));
    if (i < grads.size() && grads[i].defined()) {
      inputs.push_back(grads[i]);
    } else {
      TORCH_CHECK(t.numel() == 1, "grad can be implicitly created only for scalar outputs");
      inputs.push_back(at::ones_like(t, LEGACY_CONTIGUOUS_MEMORY_FORMAT));
    }
  }
  tlsEngine->execute(roots, inputs, /*keep_graph=*/false, /*create_graph=*/false,
                     /*accumulate_grad=*/true);
}

ScopedAutogradEngine::ScopedAutogradEngine(torch::autograd::Engine* engine) : previous_(tlsEngine) {
  tlsEngine = engine;
}

ScopedAutogradEngine::~ScopedAutogradEngine() { tlsEngine = previous_; }

}  // namespace sb::reference
