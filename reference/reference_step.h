#pragma once

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>

#include "reference/workload.h"

namespace sb::reference {

// The plain reference step of a model with forward(x), input(), target(), parameters() and
// zeroGrad(): in inference the output; in training also the input's gradient and every
// parameter's, from loss = sum(output * target), accumulated into zeroed gradients as a
// training loop with zero_grad() does.
template <class Model>
WorkloadData referenceStep(const Model& m, bool training) {
  WorkloadData d;
  d.inputs["input"] = m.input();
  if (!training) {
    c10::NoGradGuard noGrad;
    d.expected["output"] = m.forward(m.input());
    d.checked = {"output"};
    return d;
  }
  m.zeroGrad();
  const at::Tensor x = m.input().detach().requires_grad_(true);
  const at::Tensor y = m.forward(x);
  torch::autograd::backward({(y * m.target()).sum()});
  d.expected["output"] = y.detach();
  d.expected["grad_input"] = x.grad().clone();
  d.checked = {"output", "grad_input"};
  for (const auto& [name, p] : m.parameters()) {
    d.expected["grad/" + name] = p.grad().clone();
    d.checked.push_back("grad/" + name);
  }
  return d;
}

}  // namespace sb::reference
