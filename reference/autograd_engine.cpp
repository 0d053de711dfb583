#include "reference/autograd_engine.h"
#include "reference/autograd_facts.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <memory>
#include <set>

namespace sb::reference {
namespace {

thread_local torch::autograd::Engine* tlsEngine = nullptr;

// Records where a node's gradient outputs live.
class OutputAddresses final : public torch::autograd::FunctionPostHook {
 public:
  explicit OutputAddresses(std::shared_ptr<std::set<const void*>> seen) : seen_(std::move(seen)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    for (const auto& o : outputs) {
      if (o.defined()) seen_->insert(o.data_ptr());
    }
    return outputs;
  }

 private:
  std::shared_ptr<std::set<const void*>> seen_;
};

}  // namespace

bool autogradSumsGradientsInPlace() {
  static const bool inPlace = [] {
    // w feeds two products; each product's node hands w's input buffer a fresh gradient, and
    // the buffer's sum reaches w's hook: in place, it lives where one of the two did.
    at::AutoGradMode grad(true);
    const at::Tensor w = at::zeros({64}, at::kFloat).set_requires_grad(true);
    const at::Tensor a = w * 2;
    const at::Tensor b = w * 3;
    auto branches = std::make_shared<std::set<const void*>>();
    a.grad_fn()->add_post_hook(std::make_unique<OutputAddresses>(branches));
    b.grad_fn()->add_post_hook(std::make_unique<OutputAddresses>(branches));
    const void* summed = nullptr;
    w.register_hook([&summed](const at::Tensor& g) { summed = g.data_ptr(); });
    torch::autograd::backward({(a + b).sum()});
    TORCH_INTERNAL_ASSERT(summed != nullptr && branches->size() == 2,
                          "the in-place probe saw no sum of two gradients");
    return branches->count(summed) > 0;
  }();
  return inPlace;
}

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
