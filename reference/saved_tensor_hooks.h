#pragma once

// LibTorch's saved-tensor hooks from C++: what `torch.autograd.graph.saved_tensors_hooks`
// is in Python. While a ScopedSavedTensorHooks is alive on a thread, every tensor an autograd
// node saves in that thread's forward goes through its SavedTensorHooks: pack() decides what
// the node keeps, unpack() gives the tensor back when the node's backward reads it (on the
// thread that runs the backward). Selective activation checkpointing keeps some saved tensors
// and recomputes the others there (strategies/checkpointing/sac/).
//
// How: LibTorch asks the default autograd engine for the hooks of every SavedVariable it makes
// (Engine::get_default_saved_variable_hooks; PyTorch's Python engine answers with the Python
// hooks); the first scope installs an engine that answers with the calling thread's, through
// torch::autograd::set_default_engine_stub, the hook PyTorch's own Python engine uses. Where no
// scope is active it answers none, and saving is LibTorch's own.

#include <memory>

#include <ATen/core/Tensor.h>

namespace sb::reference {

class SavedTensorHooks {
 public:
  // What one saved tensor became: the tensor itself, or a handle to recompute it from.
  struct Packed {
    virtual ~Packed() = default;
  };
  virtual ~SavedTensorHooks() = default;
  // Called as a node saves `t` (a view of a value, the value itself, or a tensor of its own).
  virtual std::unique_ptr<Packed> pack(const at::Tensor& t) = 0;
  // Called as the node's backward reads it.
  virtual at::Tensor unpack(Packed& p) = 0;
};

class ScopedSavedTensorHooks {
 public:
  // `hooks` must outlive every node saved under the scope.
  explicit ScopedSavedTensorHooks(std::shared_ptr<SavedTensorHooks> hooks);
  ~ScopedSavedTensorHooks();
  ScopedSavedTensorHooks(const ScopedSavedTensorHooks&) = delete;
  ScopedSavedTensorHooks& operator=(const ScopedSavedTensorHooks&) = delete;

 private:
  std::shared_ptr<SavedTensorHooks> previous_;
};

// A pack that keeps the tensor: what saving is without hooks.
std::unique_ptr<SavedTensorHooks::Packed> keepSaved(const at::Tensor& t);
// The tensor a keepSaved() pack holds (nullptr for another kind of pack).
const at::Tensor* keptTensor(const SavedTensorHooks::Packed& p);

}  // namespace sb::reference
