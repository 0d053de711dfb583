#include "reference/saved_tensor_hooks.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/saved_variable_hooks.h>

#include <mutex>

namespace sb::reference {
namespace {

thread_local std::shared_ptr<SavedTensorHooks> tlsHooks;

struct Kept final : SavedTensorHooks::Packed {
  explicit Kept(at::Tensor t) : tensor(std::move(t)) {}
  at::Tensor tensor;
};

// One SavedVariable's hooks: the scope's hooks at the time it was saved, and what they packed.
class VariableHooks final : public torch::autograd::SavedVariableHooks {
 public:
  explicit VariableHooks(std::shared_ptr<SavedTensorHooks> hooks) : hooks_(std::move(hooks)) {}
  void call_pack_hook(const at::Tensor& tensor) override { packed_ = hooks_->pack(tensor); }
  at::Tensor call_unpack_hook() override { return hooks_->unpack(*packed_); }

 private:
  std::shared_ptr<SavedTensorHooks> hooks_;
  std::unique_ptr<SavedTensorHooks::Packed> packed_;
};

// LibTorch's engine, answering with the calling thread's hooks.
class HookingEngine final : public torch::autograd::Engine {
 public:
  std::unique_ptr<torch::autograd::SavedVariableHooks> get_default_saved_variable_hooks()
      override {
    if (!tlsHooks) return nullptr;
    return std::make_unique<VariableHooks>(tlsHooks);
  }
};

torch::autograd::Engine& hookingEngine() {
  // Never destroyed: the engine's device threads may outlive static destruction's order.
  static auto* engine = new HookingEngine();
  return *engine;
}

}  // namespace

ScopedSavedTensorHooks::ScopedSavedTensorHooks(std::shared_ptr<SavedTensorHooks> hooks)
    : previous_(std::move(tlsHooks)) {
  static std::once_flag installed;
  std::call_once(installed, [] { torch::autograd::set_default_engine_stub(&hookingEngine); });
  tlsHooks = std::move(hooks);
}

ScopedSavedTensorHooks::~ScopedSavedTensorHooks() { tlsHooks = std::move(previous_); }

std::unique_ptr<SavedTensorHooks::Packed> keepSaved(const at::Tensor& t) {
  return std::make_unique<Kept>(t);
}

const at::Tensor* keptTensor(const SavedTensorHooks::Packed& p) {
  const auto* k = dynamic_cast<const Kept*>(&p);
  return k ? &k->tensor : nullptr;
}

}  // namespace sb::reference
