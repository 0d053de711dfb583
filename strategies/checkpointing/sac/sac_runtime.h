#pragma once

// Selective activation checkpointing run inside a plan's executor (the PlanRecompute of
// strategies/sharding/auto/plan_executor.h), and its model of what the backward recomputes.
//
// Forward: while a node of a block runs, LibTorch's saved-tensor hooks
// (reference/saved_tensor_hooks.h) see every tensor its autograd node saves. A saved tensor
// lives in some storage: a parameter's or the data's (kept: held anyway), a value made outside
// this block (kept: it crosses the boundary), a value made in this block by a node the policy
// keeps (kept), one made by a node it recomputes (dropped: the pack holds which node and output,
// and the view's geometry), or the node's own (its mask, its statistics, its output: kept or
// dropped by the node's own decision, the pack holds its index among the node's saves). The
// values a block's recomputation will read (what its kept nodes made, what crossed into it) are
// held from their making to that recomputation, as torch.utils.checkpoint holds its inputs and
// its policy's cache.
//
// Backward: the first dropped tensor a block's backward reads recomputes the block: the nodes
// whose tensors were dropped and, before them, the dropped nodes they read, in forward order,
// through the executor (their edges' redistributions, their operators, the same dropout seed),
// with autograd recording so that each node saves what it saved in the forward, captured in
// order. Each dropped tensor is then handed back as recomputed (a view of the recomputed output
// at the recorded geometry, or the captured tensor), and let go after its last reader.
//
// Faults (each fails its row): `recompute_without_rng` reruns dropout with the next seed (a
// random operator recomputed without its generator's state); `saved_freed_early` lets a
// recomputed tensor go after its first reader, so a second reader reads freed memory (zeros
// here, as a pool that handed the block to someone else would hold something else).

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "strategies/checkpointing/sac/policy.h"
#include "strategies/sharding/auto/model.h"
#include "strategies/sharding/auto/plan_executor.h"

namespace sb::strategies::sac {

// What the backward recomputes under a policy, by the operators' saving (plan_memory.h's
// savesOperand; the norms', dropout's, softmax's and rope's own tensors), and the matmul flops
// of one forward and backward with it (2 m n k a product; the backward one product per operand
// that takes a gradient).
struct RecomputeModel {
  std::vector<bool> recomputed;  // per node
  // Per value a block's recomputation reads from the forward (held until then): those blocks.
  std::map<std::string, std::set<int>> heldBy;
  double forwardFlops = 0, backwardFlops = 0, recomputeFlops = 0;
  // An operator whose saving is not modelled: no flops prediction (empty when all are).
  std::string unmodelled;
  bool recomputesDropout = false;
  bool savedTwice = false;  // a recomputed value read by two backward nodes
};
// Inside a sharded plan: `rank`'s pieces (its flops); a node that reads an operand through a
// redistribution that copies saves that copy as its own, kept or recomputed with it (its
// edges rerun, collectives and all, by its recomputation).
RecomputeModel modelRecompute(const autoshard::ShardingModel& m, const std::vector<int>& choice,
                              const Policy& p, int rank = 0);

// The model's facts, which the budget solver prices with too: the products (addmm, mm, bmm,
// matmul); the operators whose node saves tensors of its own (statistics, a mask, its output,
// rope's tables); per node, how many nodes of its block that take a gradient save its storage
// (`throughViews`: a view's saves counted at the node that made its storage; false: at the view,
// as the planted budget_ignores_view_base counts them).
bool isMatmulOp(const std::string& op);
// The (node, operand) reads whose redistribution copies (a step over more than one rank).
std::set<std::pair<int, size_t>> copyingEdges(const autoshard::ShardingModel& m,
                                              const std::vector<int>& choice);
bool savesOwnTensors(const std::string& op);
std::vector<int> blockSaveReaders(const autoshard::ShardingModel& m, const std::vector<int>& choice,
                                  bool throughViews = true);

enum class SacFault { kNone, kRecomputeWithoutRng, kSavedFreedEarly };

class SacRuntime final : public autoshard::PlanRecompute,
                         public std::enable_shared_from_this<SacRuntime> {
 public:
  SacRuntime(const reference::Graph& g, Policy policy, RecomputeModel model, SacFault fault);

  void startPass(Rerun rerun, const std::vector<at::Tensor>& held) override;
  std::unique_ptr<reference::ScopedSavedTensorHooks> nodeHooks(int v) override;
  void nodeDone(int v, const std::vector<at::Tensor>& outs) override;
  void endPass() override;
  const autoshard::RecomputePolicy& replayPolicy() const override { return replay_; }
  // A tensor the executor holds through the pass besides startPass's (an FSDP unit's gathered
  // parameters, whose storage is filled again before the unit's backward): a node that saves it
  // keeps a reference, never recomputed for it.
  void hold(const at::Tensor& t);

  // Of the first pass: the matmul flops ATen ran (forward, backward and recomputation,
  // counted by a RecordFunction observer of mm, addmm, bmm and baddbmm), the nodes recomputed
  // (views apart: which of them a recomputation reruns depends on whether they copied), the
  // tensors kept and dropped.
  struct Counts {
    bool counted = false;
    double matmulFlops = 0;
    int64_t recomputedNodes = 0, recomputedMatmulNodes = 0, kept = 0, dropped = 0;
    std::vector<std::string> recomputed;  // node names, in order
  };
  const Counts& counts() const { return counts_; }
  const Policy& policy() const { return policy_; }
  const RecomputeModel& model() const { return model_; }

  // The hooks' two sides (saved_tensor_hooks.h), for the forward's node `v` (the current one).
  std::unique_ptr<reference::SavedTensorHooks::Packed> pack(int v, const at::Tensor& t);
  at::Tensor unpack(reference::SavedTensorHooks::Packed& p);

 private:
  struct Owner;
  void recompute(int region);

  const reference::Graph& g_;
  Policy policy_;
  RecomputeModel model_;
  SacFault fault_;
  autoshard::RecomputePolicy replay_;
  Rerun rerun_;
  Counts counts_;
  bool firstPass_ = true;
  uint64_t observer_ = 0;
  bool observing_ = false;

  // Per pass.
  std::map<const void*, std::shared_ptr<Owner>> owners_;  // storage -> its maker
  std::map<int, int> packIndex_;                           // per node, its saves so far
  std::map<int, std::map<std::string, at::Tensor>> held_;  // per block, what it rereads
  std::set<int> recomputedRegions_;
  // Dropped: per (node, output) the readers left and the recomputed output; per (node, index)
  // a node's own tensor dropped, and once recomputed, captured.
  std::map<std::pair<int, int>, int> readersLeft_;
  std::map<std::pair<int, int>, at::Tensor> recomputedOut_;
  std::set<std::pair<int, int>> droppedOwn_;
  std::map<std::pair<int, int>, at::Tensor> captured_;
  std::map<int, std::set<int>> droppedNodes_;  // per region, the nodes whose tensors went
};

// Prices `p` into the auto-sharding search over `m` (model.h's RecomputePricing): the nodes it
// recomputes (on the replicated plan: which of them a plan's edges add is the replay's to
// find), and per plan the replay's policy. The pricing refers to `m`, which it is stored in.
void priceRecompute(autoshard::ShardingModel& m, const Policy& p);

// A row's record of a policy's run: its parameters (the policy, the nodes recomputed and
// predicted, the tensors kept and dropped, the recompute flops), and its details ("sac": what
// was recomputed and the flops; "predictions": the step's matmul flops and the nodes
// recomputed, measured beside the model's, tolerance 0, where every operator's saving is
// modelled). Shared by the executors that run a policy (checkpointing/sac, sharding/fsdp).
int64_t predictedRecomputedNodes(const RecomputeModel& m, const reference::Graph& g);
std::vector<std::pair<std::string, std::string>> runParams(const SacRuntime& rt,
                                                           const RecomputeModel& m,
                                                           const reference::Graph& g);
void addRunDetails(nlohmann::json& j, const SacRuntime& rt, const RecomputeModel& m,
                   const reference::Graph& g);

}  // namespace sb::strategies::sac
