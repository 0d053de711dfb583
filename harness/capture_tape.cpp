// What an executor keeps of a step while capture is on (see capture_tape.h).

#include "harness/capture_tape.h"

#include <ATen/ATen.h>

namespace sb::harness {

void CaptureTape::keep(const std::string& node, const std::string& phase, const std::string& tensor,
                       const at::Tensor& piece, const Box& box) {
  values_.push_back({node, phase, tensor, piece.detach().clone(), box, TraceValue::clockNs()});
}

void CaptureTape::hookGradient(const std::string& node, const std::string& tensor,
                               const at::Tensor& t, const Box& box) {
  if (!t.requires_grad()) return;
  // A copy: the engine may sum into the gradient in place after the hook (an accumulator, an
  // optimizer's clipping).
  const unsigned id = t.register_hook([this, node, tensor, box](const at::Tensor& grad) {
    keep(node, "backward", "grad " + tensor, grad, box);
  });
  if (t.is_leaf()) leafHooks_.emplace_back(t, id);
}

void CaptureTape::removeHooks() {
  for (auto& [t, id] : leafHooks_) t.remove_hook(id);
  leafHooks_.clear();
}

std::vector<TraceValue> CaptureTape::take() {
  removeHooks();
  return std::move(values_);
}

}  // namespace sb::harness
