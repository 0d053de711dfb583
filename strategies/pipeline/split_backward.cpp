// Zero Bubble's I and W on LibTorch's autograd graph (split_backward.h).

#include "strategies/pipeline/split_backward.h"

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/variable.h>

#include <map>
#include <set>
#include <utility>

namespace sb::strategies::pipeline {

namespace ag = torch::autograd;

namespace {

// Keeps the gradients flowing into a node, the first time it runs (I).
class KeepGradients final : public ag::FunctionPreHook {
 public:
  explicit KeepGradients(std::shared_ptr<std::vector<at::Tensor>> slot) : slot_(std::move(slot)) {}
  ag::variable_list operator()(const ag::variable_list& grads) override {
    if (slot_->empty()) *slot_ = grads;
    return grads;
  }

 private:
  std::shared_ptr<std::vector<at::Tensor>> slot_;
};

// A frontier node (split_backward.h) and its edges to the activations' side.
struct Frontier {
  NodePtr node;
  std::vector<size_t> activationEdges;
};

// The frontier between the activations' side of the graph under `root` and the parameters'
// side: nodes not on the weights' side with an edge to it.
std::vector<Frontier> frontier(const NodePtr& root,
                               const std::set<const ag::Node*>& paramLeaves) {
  std::map<const ag::Node*, bool> weightSide;    // per node visited: every path ends at a parameter
  std::vector<NodePtr> order;  // post-order
  // Iterative depth-first walk (graphs of thousands of nodes).
  std::vector<std::pair<NodePtr, size_t>> stack = {{root, 0}};
  std::set<const ag::Node*> entered = {root.get()};
  while (!stack.empty()) {
    auto& [node, next] = stack.back();
    const auto& edges = node->next_edges();
    if (next < edges.size()) {
      const ag::Edge& e = edges[next++];
      if (e.is_valid() && entered.insert(e.function.get()).second) {
        stack.push_back({e.function, 0});
      }
      continue;
    }
    const ag::Node* n = node.get();
    bool side;
    if (dynamic_cast<const ag::AccumulateGrad*>(n)) {
      side = paramLeaves.count(n) > 0;
    } else {
      side = false;
      bool any = false, all = true;
      for (const ag::Edge& e : edges) {
        if (!e.is_valid()) continue;
        any = true;
        all = all && weightSide.at(e.function.get());
      }
      side = any && all;
    }
    weightSide[n] = side;
    order.push_back(node);
    stack.pop_back();
  }
  std::vector<Frontier> out;
  for (const auto& node : order) {
    if (weightSide.at(node.get())) continue;
    Frontier f{node, {}};
    bool weights = false;
    const auto& edges = node->next_edges();
    for (size_t i = 0; i < edges.size(); ++i) {
      if (!edges[i].is_valid()) continue;
      if (weightSide.at(edges[i].function.get())) {
        weights = true;
      } else {
        f.activationEdges.push_back(i);
      }
    }
    if (weights) out.push_back(std::move(f));
  }
  return out;
}

}  // namespace

at::Tensor backwardInput(const at::Tensor& x, const at::Tensor& y, const at::Tensor& gy,
                         const std::vector<at::Tensor>& params, WeightPass& w) {
  w.roots.clear();
  w.inputDone = true;
  // Nothing of the stage takes a gradient: nothing to do in I or W.
  if (!y.requires_grad()) return at::Tensor();
  // W the whole backward, from y's gradient edge.
  const auto whole = [&] {
    const ag::Edge e = ag::impl::gradient_edge(y);
    auto slot = std::make_shared<std::vector<at::Tensor>>(e.function->num_inputs());
    (*slot)[e.input_nr] = gy;
    w.roots.push_back({e.function, slot});
  };
  if (!x.requires_grad()) {
    whole();
    return at::Tensor();
  }
  std::set<const ag::Node*> leaves;
  for (const at::Tensor& p : params) {
    if (auto acc = ag::impl::try_get_grad_accumulator(p)) leaves.insert(acc.get());
  }
  const auto nodes = y.grad_fn() ? frontier(y.grad_fn(), leaves) : std::vector<Frontier>();
  if (nodes.empty()) {
    // No node mixes the two sides: the input's gradient alone (the stage reads no parameter on
    // the input's path), and W whatever reaches the parameters from the output.
    const auto gx = ag::grad({y}, {x}, {gy}, /*retain_graph=*/true, /*create_graph=*/false,
                             /*allow_unused=*/true);
    if (!params.empty()) whole();
    return gx.at(0);
  }
  for (const auto& f : nodes) {
    auto slot = std::make_shared<std::vector<at::Tensor>>();
    f.node->add_pre_hook(std::make_unique<KeepGradients>(slot));
    w.roots.push_back({f.node, slot});
  }
  const auto gx = ag::grad({y}, {x}, {gy}, /*retain_graph=*/true, /*create_graph=*/false,
                           /*allow_unused=*/true);
  for (const auto& r : w.roots) {
    TORCH_CHECK(!r.grads->empty(), "pipeline: the input gradient's pass did not reach ",
                r.node->name(), ", which the weight gradient starts from");
  }
  // The activations' side is done: each frontier node's edges to it cut, so that W, started at
  // every frontier node at once, computes only their weights' outputs and passes nothing down
  // to the frontier nodes below (whose own kept gradients already hold it). (Edges set directly:
  // a node's topological number stays an upper bound with fewer children.)
  for (const auto& f : nodes) {
    for (size_t i : f.activationEdges) f.node->next_edges()[i] = ag::Edge();
  }
  return gx.at(0);
}

void backwardWeight(WeightPass& w, const std::vector<at::Tensor>& params) {
  TORCH_CHECK(w.ready(), "pipeline: the weight gradient's pass before the input gradient's");
  ag::edge_list roots, outputs;
  ag::variable_list grads;
  for (const auto& r : w.roots) {
    for (size_t i = 0; i < r.grads->size(); ++i) {
      if (!(*r.grads)[i].defined()) continue;
      roots.emplace_back(r.node, static_cast<uint32_t>(i));
      grads.push_back((*r.grads)[i]);
    }
  }
  for (const at::Tensor& p : params) outputs.push_back(ag::impl::gradient_edge(p));
  w.roots.clear();
  w.inputDone = false;
  if (roots.empty() || outputs.empty()) return;
  const auto got = ag::Engine::get_default_engine().execute(roots, grads, /*keep_graph=*/false,
                                                            /*create_graph=*/false,
                                                            /*accumulate_grad=*/false, outputs);
  at::NoGradGuard noGrad;
  for (size_t k = 0; k < params.size(); ++k) {
    if (got[k].defined()) params[k].mutable_grad().add_(got[k]);
  }
}

}  // namespace sb::strategies::pipeline
