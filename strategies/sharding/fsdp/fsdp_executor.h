#pragma once

// The FSDP / ZeRO executor (fsdp.cpp runs a step; fsdp_memory.cpp predicts its peak), and the
// autograd function that gathers a unit's parameters and reduce-scatters their gradients.
// Internal to strategies/sharding/fsdp/.

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "harness/capture_tape.h"
#include "harness/measure/update_profile.h"
#include "harness/strategy.h"
#include "reference/graph.h"
#include "reference/training.h"
#include "strategies/checkpointing/sac/sac_runtime.h"
#include "strategies/sharding/fsdp/fsdp_plan.h"

namespace sb::strategies::fsdp {

// Gathers one parameter's shards into the whole tensor; its backward reduce-scatters the
// whole gradient into the shard's (and, in hsdp, all-reduces it over the replicas).
struct GatherParam : public torch::autograd::Function<GatherParam> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& shard,
                            int64_t executor, int64_t index);
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads);
};

class FsdpExecutor final : public harness::RankExecutor {
 public:
  // `sacFault`: a selective checkpointing fault planted in params.sac's policy.
  FsdpExecutor(Kind kind, Fault fault, harness::CaseSpec c,
               sac::SacFault sacFault = sac::SacFault::kNone);
  void prepare(harness::RankContext& ctx, const reference::WorkloadData& data) override;
  void step(harness::RankContext& ctx) override;
  std::map<std::string, at::Tensor> results() const override;
  std::vector<std::pair<std::string, std::string>> recordParams() const override;
  std::optional<int64_t> predictedPeakBytes() const override;
  // FSDP's promise is its memory: a unit left gathered breaks it however right the numbers.
  std::optional<int64_t> memoryLimitBytes() const override { return predictedPeakBytes(); }
  nlohmann::json details() const override;

  // GatherParam's halves.
  at::Tensor gather(int index, const at::Tensor& shard);
  at::Tensor reduceGrad(int index, const at::Tensor& full);

  // Locating a failure: the next step's first optimizer step keeps this rank's rows of every
  // node's output and of its gradient, and every parameter's reduced gradient (its shard, or
  // whole where it is not sharded). Not under mixed precision (the values are another dtype
  // than the reference's).
  bool capturesValues() const override { return !mixed(); }
  void setCapture(bool on) override {
    captureOn_ = on;
    if (on) captured_.clear();
    if (!on) tape_.reset();  // what a step that threw left
  }
  std::vector<harness::TraceValue> captured() const override { return captured_; }

 private:
  bool captureOn_ = false;
  std::unique_ptr<harness::CaptureTape> tape_;
  std::vector<harness::TraceValue> captured_;
  int dataIndex_ = 0;  // this rank's slice of the batch
  // The values computed from the data (the others, from parameters alone, such as a tied
  // embedding's transpose, are whole on every rank, and their gradients this rank's part).
  std::set<std::string> fromData_, batchRows_;
  // A local value's rows of the whole value: the batch (or tokens) dimension first.
  harness::Box batchBox(const at::Tensor& local) const {
    harness::Box b = harness::Box::whole(local.sizes());
    if (!b.offset.empty()) b.offset[0] = dataIndex_ * local.size(0);
    return b;
  }
  // Where the forward and backward reach a point at which FSDP allocates or frees parameter
  // memory: the profile pass (prepare) records the live bytes there, the model adds FSDP's.
  enum class MarkKind { kStart, kGather, kUnitEnd, kRegather, kGradReady, kBackwardEnd, kDone };
  struct Mark {
    MarkKind kind;
    int index;        // the unit (gather, unit end, regather) or parameter (grad ready)
    int64_t live;     // the profile's live bytes here, above its start
    int64_t peak;     // the most it held since the previous mark, above its start
    bool contiguous;  // grad ready: the gradient autograd hands over is contiguous
  };
  void mark(MarkKind kind, int index, bool contiguous = true);
  // One forward and backward of this rank's batch; the loss summed over the ranks. With
  // profile_ set: on whole parameters, no communication, parameters never freed, the marks
  // recorded.
  double pass();
  // Gathers `unit` for its forward (marked), and, where prefetching, the next units.
  void gatherUnit(int unit, std::map<std::string, at::Tensor>& values);
  void gatherParams(int unit, std::map<std::string, at::Tensor>& values);
  void reshardUnit(int unit, bool free = true);
  void regatherUnit(int unit);
  void regatherParams(int unit);
  void makeParams();
  // The model of a step's peak above what is live before the parameters are made (memory
  // model, in predictedPeakBytes' comment), from the profile's marks.
  void modelMemory(harness::RankContext& ctx);
  // Every shard's rows of parameter `index` (torch.chunk's), for its gathers and scatters.
  const std::vector<int64_t>& rowsOf(int index) const { return rows_[index]; }
  // This rank's rows of parameter `index`: {offset, length}.
  std::pair<int64_t, int64_t> shardRows(int index) const { return shardRows_[index]; }
  harness::Communicator& shardComm() {
    return kind_ == Kind::kHsdp ? ctx_->group({1}) : ctx_->world();
  }

  harness::CaseSpec case_;
  Kind kind_;
  Fault fault_;
  sac::SacFault sacFault_ = sac::SacFault::kNone;
  bool reshardAfterForward_ = true;
  int prefetch_ = 0;  // units gathered ahead, forward and backward (params.prefetch)
  // params.param_dtype: what the units are gathered and computed in (the shards, the
  // optimizer and the reductions stay in the case's dtype, float32)
  at::ScalarType paramDtype_;
  bool mixed() const { return paramDtype_ != case_.dtype; }
  Layout layout_;
  reference::Graph local_;  // the graph at this rank's batch
  Units units_;
  harness::RankContext* ctx_ = nullptr;
  std::map<std::string, at::Tensor> inputs_;  // this rank's data inputs, and the constants
  std::set<std::string> constants_;           // an imported model's constant inputs
  at::Tensor target_;
  std::vector<std::string> names_;  // parameters, in graph order
  // From the layout and the graph once, not per collective or node: each parameter's rows per
  // shard and this rank's, its unit, each unit's parameter indices, and the units whose
  // forward ends at each node.
  std::vector<std::vector<int64_t>> rows_;
  std::vector<std::pair<int64_t, int64_t>> shardRows_;
  std::vector<int> unitOf_;
  std::vector<std::vector<int>> unitParams_;
  std::vector<std::vector<int>> unitsEndingAt_;
  std::vector<std::vector<int64_t>> sizes_;  // whole parameters' sizes
  std::vector<at::Tensor>
      initial_;                   // initial parameters: whole, or this rank's shards (zero3, hsdp)
  std::vector<at::Tensor> full_;  // ddp/zero1/zero2 (and the profile): whole leaves
  std::vector<at::Tensor> shards_;       // sharded state: this rank's shard leaves
  std::vector<at::Tensor> staleShards_;  // fault stale_shard: what the optimizer steps
  std::vector<at::Tensor> gathered_;     // zero3/hsdp: the unit tensors gathered
  std::vector<at::Tensor> prefetched_;   // all-gathered ahead of their unit's forward
  std::vector<bool> unitGathered_;
  std::vector<int> order_;        // the block units in the order their forwards run
  std::vector<int> orderPos_;     // per unit: its place in order_ (-1: the root)
  std::vector<int> unitPending_;  // per unit: gradients not reduced yet this backward
  std::unique_ptr<reference::TrainingLoop> loop_;
  // The memory model: the profile's marks, and what it predicts.
  bool profile_ = false;
  int64_t live0_ = 0;
  std::vector<Mark> marks_;
  int64_t paramBytes_ = 0;  // what makeParams allocates
  int64_t stepPeak_ = 0;    // the model's peak above startLive_ + paramBytes_
  int64_t entryLive_ = 0, startLive_ = 0;
  nlohmann::json memoryDetails_;
  // params.sac: a selective checkpointing policy inside every block's forward
  // (strategies/checkpointing/sac/), its recomputation reading the unit's gathered parameters
  // (gathered again before the unit's backward, as FSDP2's pre-backward hook does). The model's
  // facts (what it recomputes, its flops) from the graph at this rank's batch on one rank.
  std::shared_ptr<sac::SacRuntime> sac_;
  std::unique_ptr<autoshard::ShardingModel> sacGraph_;
  sac::RecomputeModel sacModel_;
  std::map<std::string, int> paramIndex_;
  std::map<std::string, int> lastRead_;  // per value, the last node that reads it
  // A forward and backward with the policy's runtime told of it, its end told however it ends.
  struct SacPass {
    FsdpExecutor& e;
    explicit SacPass(FsdpExecutor& x);
    ~SacPass();
  };
};

}  // namespace sb::strategies::fsdp
