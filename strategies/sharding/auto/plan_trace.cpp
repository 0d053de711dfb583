// A plan's step traced value by value (see plan_trace.h).

#include "strategies/sharding/auto/plan_trace.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <set>

#include "harness/box.h"
#include "reference/ops.h"

namespace sb::strategies::autoshard {
namespace {

using harness::TraceValue;

// Per value, the first node that reads it: its backward completes the value's gradient.
std::map<std::string, size_t> firstReaders(const reference::Graph& g) {
  std::map<std::string, size_t> first;
  for (size_t v = 0; v < g.nodes.size(); ++v) {
    for (const auto& a : g.nodes[v].args) first.emplace(a, v);
  }
  return first;
}

}  // namespace

std::string planReadName(const reference::Graph& g, size_t v, size_t i) {
  return g.nodes[v].args[i] + " -> " + g.nodes[v].name + "[" + std::to_string(i) + "]";
}

std::vector<TraceValue> planReferenceTrace(const ShardingModel& model,
                                           const std::vector<PlanEdge>& edges,
                                           const harness::CaseSpec& c,
                                           const reference::WorkloadData& data) {
  std::set<std::pair<size_t, size_t>> edgeReads;
  for (const auto& e : edges) edgeReads.emplace(e.node, e.operand);
  return graphReferenceTrace(model.graph(), edgeReads, c, data);
}

std::vector<TraceValue> graphReferenceTrace(const reference::Graph& g,
                                            const std::set<std::pair<size_t, size_t>>& edgeReads,
                                            const harness::CaseSpec& c,
                                            const reference::WorkloadData& data) {
  std::map<std::string, at::Tensor> values;
  for (const auto& [name, shape] : g.inputs) values[name] = data.inputs.at(name);
  for (const auto& [name, shape] : g.parameters) {
    values[name] = data.inputs.at(name).detach().clone().set_requires_grad(true);
  }
  // A read through an edge is a copy of its own, so that the gradient its reader sends back
  // is told apart from the value's other readers'.
  std::map<std::pair<size_t, size_t>, at::Tensor> reads;
  std::vector<TraceValue> out;
  for (size_t v = 0; v < g.nodes.size(); ++v) {
    const auto& n = g.nodes[v];
    const auto operands = n.shape.operands();
    std::map<std::string, at::Tensor> args;
    for (size_t i = 0; i < operands.size(); ++i) {
      at::Tensor t = values.at(n.args[i]);
      if (edgeReads.count({v, i})) {
        t = t.clone();
        reads[{v, i}] = t;
        out.push_back({n.name, "forward", planReadName(g, v, i), t.detach(), {}});
      }
      args[operands[i]] = t;
    }
    const auto ys = reference::opForward(n.shape, args, c.seed + n.seedOffset);
    const auto names = n.outputs();
    for (size_t j = 0; j < ys.size(); ++j) {
      values[names[j]] = ys[j];
      out.push_back({n.name, "forward", names[j], ys[j].detach(), {}});
    }
  }
  // The backward, seeded as the executor seeds it: grad_output, or a training case's target
  // (its first step's d sum(output * target) / d output).
  const at::Tensor seed = data.inputs.at(c.training.enabled() ? "target" : "grad_output");
  std::vector<std::pair<std::string, std::string>> order;  // (node, tensor), in backward order
  std::vector<at::Tensor> wrt;
  const auto first = firstReaders(g);
  // The output's gradient is the seed itself, traced as the backward's first value.
  order.emplace_back(g.nodes[g.producer(g.output).first].name, "grad " + g.output);
  wrt.push_back(values.at(g.output));
  for (size_t k = g.nodes.size(); k-- > 0;) {
    const auto& n = g.nodes[k];
    for (size_t i = 0; i < n.args.size(); ++i) {
      auto it = reads.find({k, i});
      if (it == reads.end() || !it->second.requires_grad()) continue;
      order.emplace_back(n.name, "grad " + planReadName(g, k, i));
      wrt.push_back(it->second);
    }
    std::set<std::string> done;
    for (const auto& a : n.args) {
      if (first.at(a) != k || !done.insert(a).second || g.isInput(a)) continue;
      const at::Tensor& t = values.at(a);
      if (!t.requires_grad()) continue;
      order.emplace_back(n.name, "grad " + a);
      wrt.push_back(t);
    }
  }
  const auto grads = torch::autograd::grad({values.at(g.output)}, wrt, {seed},
                                           /*retain_graph=*/false, /*create_graph=*/false,
                                           /*allow_unused=*/true);
  for (size_t k = 0; k < order.size(); ++k) {
    if (!grads[k].defined()) continue;
    out.push_back({order[k].first, "backward", order[k].second, grads[k], {}});
  }
  return out;
}

PlanCapture::PlanCapture(const ShardingModel& model, const std::vector<int>& choice,
                         harness::RankContext& ctx, const std::map<std::string, at::Tensor>& leaves)
    : model_(model), choice_(choice), ctx_(ctx) {
  const auto& g = model_.graph();
  const auto mesh = ctx_.mesh().shape();
  const auto coords = ctx_.mesh().coords(ctx_.rank());
  for (const auto& [name, leaf] : leaves) {
    const harness::Layout layout = *model_.valueLayout(name, choice_);
    tape_.hookGradient("", name, leaf, layout.box(g.valueShape(name), mesh, coords));
  }
}

void PlanCapture::keep(const std::string& tensor, const at::Tensor& t,
                       const harness::Layout& layout, const std::vector<int64_t>& shape) {
  const harness::Box box = layout.box(shape, ctx_.mesh().shape(), ctx_.mesh().coords(ctx_.rank()));
  at::Tensor piece = t.detach().clone(at::MemoryFormat::Contiguous);  // allReduce's need
  if (!layout.partialAxes().empty()) ctx_.group(layout.partialAxes()).allReduce(piece);
  tape_.keep("", "forward", tensor, piece, box);
  // Gradients are kept whole in their value's layout (plan_executor.cpp): a pending sum's
  // gradient is the whole tensor's on its box.
  tape_.hookGradient("", tensor, t, box);
}

void PlanCapture::operand(size_t v, size_t i, const at::Tensor& t) {
  const auto& g = model_.graph();
  const Candidate& cand = model_.candidates(static_cast<int>(v))[choice_[v]];
  keep(planReadName(g, v, i), t, cand.op.operands[i], g.valueShape(g.nodes[v].args[i]));
}

void PlanCapture::outputs(size_t v, const std::vector<at::Tensor>& outs) {
  const auto& g = model_.graph();
  const Candidate& cand = model_.candidates(static_cast<int>(v))[choice_[v]];
  const auto names = g.nodes[v].outputs();
  for (size_t j = 0; j < outs.size() && j < names.size(); ++j) {
    keep(names[j], outs[j], cand.outputs[j], g.valueShape(names[j]));
  }
}

}  // namespace sb::strategies::autoshard
