#pragma once

// What an executor keeps of a step while capture is on (RankExecutor::setCapture): its pieces
// of the step's values in the order it makes them, forward values as they are made and
// gradients as the autograd engine completes them (a hook on the tensor: it fires once every
// contribution is summed, so in the engine's order). harness/run/divergence.h compares them
// with the reference.

#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "harness/box.h"
#include "harness/trace_value.h"

namespace sb::harness {

class CaptureTape {
 public:
  CaptureTape() = default;
  CaptureTape(const CaptureTape&) = delete;
  CaptureTape& operator=(const CaptureTape&) = delete;
  ~CaptureTape() { removeHooks(); }

  // A value as made (a copy of `piece`, at `box` of the whole value).
  void keep(const std::string& node, const std::string& phase, const std::string& tensor,
            const at::Tensor& piece, const Box& box);
  // `t`'s gradient, when the backward completes it, as "grad <tensor>" at `box` (a gradient is
  // laid out as its value). A leaf's hook stays on the leaf until take() or the tape's end.
  void hookGradient(const std::string& node, const std::string& tensor, const at::Tensor& t,
                    const Box& box);
  // Everything kept, the hooks removed.
  std::vector<TraceValue> take();

 private:
  void removeHooks();
  std::vector<TraceValue> values_;
  std::vector<std::pair<at::Tensor, unsigned>> leafHooks_;
};

}  // namespace sb::harness
