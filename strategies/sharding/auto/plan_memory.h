#pragma once

// The memory of one rank's step through a sharding plan (plan_executor.cpp), replayed
// allocation by allocation: the plan's prediction of the row's peak, to the byte.
//
// The liveness model (model.h) prices a candidate plan for the integer program from node-level
// terms; this replays the plan that was chosen, as the executor and LibTorch's autograd engine
// run it:
//   forward   node by node: each edge's redistribution (RedistRunner::memory), each operator's
//             forward as its rule's replay has it (op_rule.h's MemoryReplay, split at
//             backwardBegins()), views sharing their input's storage (a reshape copies where
//             its strides do not allow a view), values dropped after their last reader, what
//             each operator saves for its backward kept;
//   backward  the engine's order: a node runs once every gradient of its outputs has arrived,
//             the latest-created first (the parameters' accumulators before all); each
//             operator's backward as its rule's replay has it, an edge's redistribution of the
//             gradient back, a partial gradient's all-reduce (a copy and the backend's scratch),
//             the incoming gradients freed after the node and its saved tensors after them; two
//             gradients of one value summed in place when the first is the only reference to its
//             storage, into a new tensor otherwise (InputBuffer::accumulate); a parameter's
//             gradient kept as it is when nothing else references it and its strides are the
//             parameter's, copied otherwise (AccumulateGrad).
// Tensors are tracked by reference, as LibTorch counts them (a tensor and its storage), so that
// those decisions are the engine's.
//
// Operators the replay does not know (no rule replay that fits the split, an unused output of a
// split) make it throw PlanMemoryUnknown: the executor then has no memory prediction and says
// why, rather than a wrong one.

#include <cstdint>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "harness/comm/rank_context.h"
#include "strategies/sharding/auto/model.h"
#include "strategies/sharding/layout/redistribute.h"

namespace sb::strategies::autoshard {

// A read whose layout differs from the one its value was written in: the redistribution into
// the layout the node reads, and the gradient's back.
struct PlanEdge {
  int node = 0;
  size_t operand = 0;
  harness::RedistGeometry geometry;
  harness::RedistPlan forward, backward;
};

struct PlanMemoryUnknown : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// One allocation (bytes > 0) or release (bytes < 0) of the replay, for SB_MEMORY_TRACE's
// `model` lines (reports/memory_trace.py --model).
struct PlanMemoryEvent {
  int64_t bytes;
  std::string what;
};

// The operators of `g` whose replay inside a plan has not been checked against the tracker to
// the byte (sorted, without repeats; empty when all have): the plan executor claims its memory
// exact only without them. Checked: the built-in graphs' operators (gpt2, bert, mlp: embedding,
// add, layer_norm, addmm, view, permute, transpose, bmm, softmax, dropout, gelu; llama: mm,
// rms_norm, rope, silu, mul), by suites/autoshard.yaml and ci/autoshard_test.sh on every rank,
// threads and gloo.
std::vector<std::string> unverifiedOperators(const reference::Graph& g);

// Whether an operator's autograd node keeps operand i for its backward (LibTorch 1.13's nodes
// and the rules' own functions), given which operands take a gradient; besides what its rule's
// replay allocates for it (layer norm's statistics, dropout's mask). The replay holds what it
// says; the liveness rows count a gathered parameter kept by it.
bool savesOperand(const ResolvedOp& r, size_t i, const std::vector<bool>& grads);

// The edges of a plan: every read in another layout than its value was written in, with the
// planner's cheapest paths by the model's pricing (what the executor runs).
std::vector<PlanEdge> planEdges(const ShardingModel& model, const std::vector<int>& choice);

// Selective activation checkpointing (strategies/checkpointing/sac/sac_runtime.h) as the replay
// follows it: per node its block (-1 outside every block) and whether what its autograd node
// saves is kept; per value, the blocks whose recomputation reads it from the forward. A saved
// tensor in a block is dropped where the storage it lives in was made in that block by a node
// not kept, or is the node's own and the node is not kept; the first backward node of a block
// that reads a dropped tensor recomputes the block's dropped nodes and those they read, each
// node's forward as the forward replayed it, what each dropped reader needs kept to its
// backward.
// (RecomputePolicy is declared in model.h, where the search prices it too.)

// What a recomputation reruns besides `needed` (in place): the nodes of a needed node's block,
// not kept, whose outputs it reads, and so on back (the executor's runtime and the replay both
// close over this, so that they rerun the same nodes).
void recomputeClosure(const reference::Graph& g, const std::vector<bool>& save,
                      const std::vector<int>& region, std::vector<bool>& needed);

// Every rank's peak of the plan's step (what the executor holds included), by the replay on a
// `threads` world of the model's mesh and dtype: what solving checks a memory limit with.
// Throws PlanMemoryUnknown.
std::vector<int64_t> replayPlanPeaks(const ShardingModel& model, const std::vector<int>& choice);

// The peak bytes above what is live when the step starts (the executor's parameters, data
// slices and gradient seed), on this rank. Throws PlanMemoryUnknown (above).
// `freeEarly`: the planted fault liveness_frees_early, a replay that frees every value at its
// last reader's forward, as if nothing that reader saved held it to its backward.
// `liveAfterForward`: per node in execution order, the bytes live once its forward ran, what the
// executor holds included (what the liveness rows' forward points are compared with).
int64_t replayPlanStep(const ShardingModel& model, const std::vector<int>& choice,
                       const std::vector<PlanEdge>& edges, harness::RankContext& ctx,
                       at::ScalarType dtype, std::vector<PlanMemoryEvent>* log,
                       bool freeEarly = false, int64_t* heldBytes = nullptr,
                       const RecomputePolicy* recompute = nullptr,
                       std::vector<int64_t>* liveAfterForward = nullptr);

}  // namespace sb::strategies::autoshard
