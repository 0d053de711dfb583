#pragma once

// A plan's step traced value by value, for locating where a failing row first leaves the
// reference (harness/run/divergence.h). In the graph's execution order:
//   forward   node by node: each operand read through an edge, as read ("h0.ln1 ->
//             h0.attn.q[0]": the edge's redistribution made it), then the node's outputs;
//   backward  nodes in reverse: the gradients of the node's operands read through edges (the
//             node's backward made them: "grad h0.ln1 -> h0.attn.q[0]"), then the gradients of
//             the values the node's backward completes (the node is their first reader:
//             "grad h0.ln1", "grad wte").
// The reference side runs the graph on whole tensors (reference::runGraph) and takes every
// gradient with autograd; the executor's side keeps its pieces as it runs (PlanCapture).

#include <map>
#include <set>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "harness/capture_tape.h"
#include "harness/case.h"
#include "harness/comm/rank_context.h"
#include "harness/trace_value.h"
#include "reference/workload.h"
#include "strategies/sharding/auto/model.h"
#include "strategies/sharding/auto/plan_memory.h"

namespace sb::strategies::autoshard {

// Operand `i` of node `v` as read through an edge: "h0.ln1 -> h0.attn.q[0]".
std::string planReadName(const reference::Graph& g, size_t v, size_t i);

// The same for any executor of graph `g` (FSDP's too), with `edgeReads` the (node, operand)
// reads traced as read.
std::vector<harness::TraceValue> graphReferenceTrace(
    const reference::Graph& g, const std::set<std::pair<size_t, size_t>>& edgeReads,
    const harness::CaseSpec& c, const reference::WorkloadData& data);

// The trace of the plain graph on the case's inputs, whole tensors, in the order above.
std::vector<harness::TraceValue> planReferenceTrace(const ShardingModel& model,
                                                    const std::vector<PlanEdge>& edges,
                                                    const harness::CaseSpec& c,
                                                    const reference::WorkloadData& data);

// One rank's pieces of the same values, kept while the plan executor runs a step, in the order
// it makes them (harness/capture_tape.h: gradients in the autograd engine's order).
class PlanCapture {
 public:
  // Hooks the parameters' (`leaves`, by name) gradients until take().
  PlanCapture(const ShardingModel& model, const std::vector<int>& choice, harness::RankContext& ctx,
              const std::map<std::string, at::Tensor>& leaves);
  // Forward: operand `i` of node `v` as read through an edge, and node v's outputs. Pending sums
  // are reduced over their axes (a collective, alike on every rank); what needs a gradient has
  // it hooked.
  void operand(size_t v, size_t i, const at::Tensor& t);
  void outputs(size_t v, const std::vector<at::Tensor>& outs);
  // After the backward: everything kept, the hooks removed.
  std::vector<harness::TraceValue> take() { return tape_.take(); }

 private:
  const ShardingModel& model_;
  const std::vector<int>& choice_;
  harness::RankContext& ctx_;
  harness::CaptureTape tape_;
  void keep(const std::string& tensor, const at::Tensor& t, const harness::Layout& layout,
            const std::vector<int64_t>& shape);
};

}  // namespace sb::strategies::autoshard
