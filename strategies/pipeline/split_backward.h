// A stage's backward split as Zero Bubble splits it (torch.distributed.pipelining's
// stage_backward_input and stage_backward_weight), on LibTorch's autograd graph:
//
//   I  the input's gradient alone. Before it runs, the stage's graph is walked from its output:
//      a node is on the weights' side where every path from it ends at one of the stage's
//      parameters (a weight's transpose, a bias's broadcast); the frontier is every other node
//      with an edge to that side (a matmul of an activation by a weight, an add of a bias). Each
//      frontier node gets a pre-hook that keeps the gradients flowing into it. The engine then
//      runs only what the input's gradient needs, so that a matmul's node computes its
//      activation's gradient and not its weight's.
//   W  the parameters' gradients from the frontier's kept gradients: the engine started at the
//      frontier nodes (Engine::execute from those edges, the parameters' gradient edges as its
//      outputs) runs only the weights' side of each (a matmul's weight product, a bias's sum),
//      and nothing of the activations' again. The gradients are added into each parameter's
//      `grad` in place, as AccumulateGrad adds them.
//
// Where the stage's input takes no gradient (ids), I computes nothing and W is the whole
// backward from the output's gradient; where no node mixes the two sides (the output depends on
// the parameters alone, or the stage has none), I is the input's gradient alone and W whatever
// reaches the parameters from the output.

#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include <torch/csrc/autograd/edge.h>

namespace sb::strategies::pipeline {

// How LibTorch holds an autograd node: a std::shared_ptr in 1.13, a c10::intrusive_ptr in 2.x.
using NodePtr = decltype(torch::autograd::Edge::function);

// What I leaves for W: the edges W starts from and the gradients kept for them.
struct WeightPass {
  struct Root {
    NodePtr node;
    std::shared_ptr<std::vector<at::Tensor>> grads;  // filled by the node's pre-hook during I
  };
  std::vector<Root> roots;
  bool inputDone = false;  // I ran, and W has not
  bool ready() const { return inputDone; }
};

// I: the gradient of x (undefined where x takes none) from y's gradient gy, the graph kept;
// `w` is what W needs.
at::Tensor backwardInput(const at::Tensor& x, const at::Tensor& y, const at::Tensor& gy,
                         const std::vector<at::Tensor>& params, WeightPass& w);
// W: every parameter's gradient from what I kept, added into its `grad`; the graph let go.
void backwardWeight(WeightPass& w, const std::vector<at::Tensor>& params);

}  // namespace sb::strategies::pipeline
