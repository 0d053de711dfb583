#pragma once

// The executor of a sharding plan (plan_executor.cpp's comment says how it runs one) and the
// solved plan it runs; PlanStrategy (plan_strategy.cpp) solves or reads the plan for a case and
// makes one executor per rank. Internal to strategies/sharding/auto/.

#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "harness/strategy.h"
#include "reference/saved_tensor_hooks.h"
#include "reference/training.h"
#include "strategies/sharding/auto/model.h"
#include "strategies/sharding/auto/plan_memory.h"
#include "strategies/sharding/auto/plan_trace.h"
#include "strategies/sharding/layout/redistribute_exec.h"

namespace sb::strategies::autoshard {

using harness::Box;
using harness::CaseSpec;
using harness::Layout;
using harness::RankContext;

// A case's model and plan.
struct SolvedPlan {
  std::unique_ptr<harness::CostProfile> profile = std::make_unique<harness::CostProfile>();
  std::unique_ptr<ShardingModel> model;
  ShardingPlan plan;
  nlohmann::json json;
  // Per node, per operand: the redistribution into the layout it reads (none: same layout, a
  // graph input, or a parameter's first reader).
  std::vector<PlanEdge> edges;
  std::string problem;  // non-empty: no plan (unsupported)
};

// The plan of `algo` (ilp, megatron, data-parallel, replicated) for a case: the model from the
// case's graph, mesh and cost parameters (cost_profile, intra_node_bandwidth,
// inter_node_bandwidth), handed to `prepare` before solving (a planted fault, a checkpointing
// policy priced), solved under params max_memory, time_limit, mip_rel_gap and tp_axis (each
// checked against its range, InputError naming it), its edges planned. No plan: `problem` says
// why.
std::shared_ptr<SolvedPlan> solveCasePlan(const CaseSpec& c, const std::string& algo,
                                          const std::function<void(ShardingModel&)>& prepare = {});
// Those params each on its own, before any graph (Strategy::checkParams): the cost model's, and
// the search's ranges. Throws InputError naming the key.
void checkPlanParams(const CaseSpec& c);

// A plan's predicted communication per rank: per group of mesh axes, and per node and phase
// (an edge is its consumer's: the executor runs it inside the consuming node; the backward
// runs the nodes the other way), over the case's steps. `recomputed` (selective
// checkpointing): those nodes' forward collectives and redistributions again, in their
// backward.
std::vector<std::pair<std::vector<int>, harness::CommStats>> planCommByGroup(
    const SolvedPlan& s, const CaseSpec& c, int rank,
    const std::vector<bool>* recomputed = nullptr);
std::vector<harness::NodeComm> planCommByNode(const SolvedPlan& s, const CaseSpec& c, int rank,
                                              const std::vector<bool>* recomputed = nullptr);

// A plan's tolerance for a tensor, from the dtype's `base`: a split reduction over every rank of
// the longest sum, over the case's steps (exact inputs judged as random ones past a
// normalisation or an activation).
harness::Tolerance planTolerance(harness::Tolerance base, const SolvedPlan& s, const CaseSpec& c,
                                 const at::Tensor& expected);

// Where a parameter lives: its first reader's operand.
Layout parameterLayout(const SolvedPlan& s, const std::string& name);
// Where a result of a plan's row lives on `rank`: the output in the graph output's layout,
// grad/, param/ and state/<parameter>/<key> in their parameter's.
Box planResultBox(const SolvedPlan& s, const std::string& tensor, const CaseSpec& c, int rank);

// Selective activation checkpointing inside a plan (strategies/checkpointing/sac/ implements
// it): told of every node's forward, it decides what each node's autograd keeps of what it saves
// and recomputes the rest in the backward by rerunning nodes through the executor.
class PlanRecompute {
 public:
  virtual ~PlanRecompute() = default;
  using Value = std::function<at::Tensor(const std::string&)>;
  // Reruns node v's forward (its edges' redistributions, its operator) on its operands: `value`
  // gives those that are earlier nodes' outputs, the executor its data and parameters.
  // `seedShift` is added to a dropout's seed (a planted fault).
  using Rerun =
      std::function<std::vector<at::Tensor>(int v, const Value& value, uint64_t seedShift)>;
  // A forward and backward begins: how to rerun a node, and what the executor holds through
  // the pass (parameters, data, the gradient seed), which is never recomputed.
  virtual void startPass(Rerun rerun, const std::vector<at::Tensor>& held) = 0;
  // The saved-tensor hooks for node v's forward (nullptr: LibTorch's own saving).
  virtual std::unique_ptr<reference::ScopedSavedTensorHooks> nodeHooks(int v) = 0;
  // Node v's outputs as it made them.
  virtual void nodeDone(int v, const std::vector<at::Tensor>& outs) = 0;
  // The backward is over: what the pass still holds goes.
  virtual void endPass() = 0;
  // What the memory replay follows (plan_memory.h).
  virtual const RecomputePolicy& replayPolicy() const = 0;
};

class PlanExecutor final : public harness::RankExecutor {
 public:
  // `memoryLimit`: the params.max_memory the plan was chosen under, which it promises to fit.
  PlanExecutor(const CaseSpec& c, std::shared_ptr<const SolvedPlan> solved,
               std::optional<int64_t> memoryLimit, bool fault, bool replayFault)
      : case_(c),
        solved_(std::move(solved)),
        memoryLimit_(memoryLimit),
        fault_(fault),
        replayFault_(replayFault) {}
  void prepare(RankContext& ctx, const reference::WorkloadData& data) override;
  void step(RankContext& ctx) override;
  std::map<std::string, at::Tensor> results() const override;
  std::optional<int64_t> predictedPeakBytes() const override {
    if (!replayed_) return std::nullopt;
    const int64_t onePass = heldBytes_ + stepPeak_;
    if (!case_.training.enabled()) return onePass;
    // Over steps: the plan's peak with the optimizer's state alive (every backward after the
    // first), or the update between backwards, as its profile measured it above the step's start.
    const int64_t later = case_.training.steps > 1 ? stateBytes_ : 0;
    return std::max(onePass + initialBytes_ + later, startLive_ + updatePeak_);
  }
  std::optional<double> predictedTimeUs() const override {
    return solved_->plan.predictedStepUs * (case_.training.enabled() ? case_.training.steps : 1);
  }
  // A plan chosen under params.max_memory promises to fit it on every rank.
  std::optional<int64_t> memoryLimitBytes() const override { return memoryLimit_; }
  // What the executor holds through a step (parameters' pieces, data slices, the seed).
  int64_t heldBytes() const { return heldBytes_; }
  // Selective activation checkpointing (above), which the memory replay follows.
  void setRecompute(std::shared_ptr<PlanRecompute> r) { recompute_ = std::move(r); }
  std::vector<std::pair<std::string, std::string>> recordParams() const override {
    const auto& s = solved_->plan.solver;
    std::vector<std::pair<std::string, std::string>> out = {{"algo", s.algo},
                                                            {"solver_status", s.status}};
    if (case_.training.enabled()) {
      out.emplace_back("steps", std::to_string(case_.training.steps));
      out.emplace_back("optimizer", case_.training.optimizer.toString());
      out.emplace_back("update_peak_bytes", std::to_string(updatePeak_));
    }
    return out;
  }
  nlohmann::json details() const override {
    nlohmann::json j = solved_->json;
    nlohmann::json rows = nlohmann::json::array();
    const auto liveness = solved_->model->livenessRows(solved_->plan.choice);
    // The forward's rows, one a node in execution order, beside the replay's live bytes once
    // that node ran: between two nodes no kernel's scratch is live, so where they differ the
    // rows miscount a tensor (memory_rows_against_replay).
    size_t forward = 0;
    int64_t pointsEqual = 0;
    struct {
      std::string at;
      int64_t rows = 0, replayed = 0;
    } worst;
    for (const auto& point : liveness) {
      const std::string& what = point.at;
      rows.push_back({{"at", what}, {"live_bytes", point.liveBytes}});
      if (what.rfind("forward, after ", 0) != 0 || forward >= liveAfterForward_.size()) continue;
      // The row is the node's peak; once it ran, its transient is gone.
      const int64_t bytes = point.liveBytes - point.during;
      const int64_t replayed = liveAfterForward_[forward++];
      if (point.during) rows.back()["once_ran_bytes"] = bytes;
      rows.back()["replayed_bytes"] = replayed;
      if (bytes == replayed) ++pointsEqual;
      if (worst.at.empty() || std::abs(bytes - replayed) > std::abs(worst.rows - worst.replayed)) {
        worst = {what.substr(15), bytes, replayed};  // the node's name
      }
    }
    j["memory_rows"] = rows;
    if (forward > 0) {
      j["memory_rows_against_replay"] = {{"forward_points", forward},
                                         {"equal", pointsEqual},
                                         {"worst",
                                          {{"at", "forward, after " + worst.at},
                                           {"rows", worst.rows},
                                           {"replayed", worst.replayed}}}};
      // Judged to the byte where the rows know every operator's saved tensors (the built-in
      // graphs' operators) and no selective checkpointing drops them; an imported graph's aten
      // kernels are counted as saving every operand they read, an estimate, and the rows of a
      // priced recomputation policy miss some of what its forward keeps (docs/autoshard.md).
      if (replayed_ && unverifiedOperators(solved_->model->graph()).empty() && !recompute_ &&
          !solved_->model->recomputePricing()) {
        j["predictions"].push_back(
            {{"what", "memory_rows"},
             {"about",
              "the integer program's memory rows once each forward node ran, against "
              "the replay of the plan; worst at " +
                  worst.at},
             {"unit", "bytes"},
             {"measured", worst.replayed},
             {"predicted", worst.rows},
             {"tolerance", 0}});
      }
    }
    // The integer program's objective is the plan's step as its classes, edges and costs price
    // it; stepUs prices the same plan node by node, another walk of the model: they agree to
    // rounding, so a cost the program leaves out or counts twice shows here even where the plan
    // it picked still runs right (judged with the row's predictions).
    const auto& plan = solved_->plan;
    if (plan.solver.algo == "ilp" &&
        (plan.solver.status == "optimal" || plan.solver.status == "feasible")) {
      j["predictions"].push_back(
          {{"what", "program_objective"},
           {"about",
            "the integer program's objective, against the plan's step priced node by node"},
           {"unit", "us"},
           {"measured", plan.predictedStepUs},
           {"predicted", plan.solver.objectiveUs},
           {"tolerance", 1e-9}});
    }
    // The row's prediction is the replay of the plan chosen; the rows above are what the
    // integer program priced it with.
    j["predicted"]["liveness_peak_bytes"] = solved_->plan.livenessPeakBytes;
    if (replayed_) {
      const auto unverified = unverifiedOperators(solved_->model->graph());
      std::string note = "replay";
      for (size_t i = 0; i < unverified.size(); ++i) {
        note += (i == 0 ? " (not checked to the byte on: " : ", ") + unverified[i];
      }
      j["predicted"]["memory_model"] = note + (unverified.empty() ? "" : "; judged within 5%)");
    } else {
      j["predicted"]["memory_model"] = "none: " + notReplayed_;
    }
    return j;
  }
  // Locating a failure (plan_trace.h): the next step keeps this rank's pieces of every value.
  bool capturesValues() const override { return true; }
  void setCapture(bool on) override {
    captureOn_ = on;
    if (on) captured_.clear();
    if (!on) capture_.reset();  // what a step that threw left (its hooks removed with it)
  }
  std::vector<harness::TraceValue> captured() const override { return captured_; }

 private:
  const CaseSpec& case_;
  std::shared_ptr<const SolvedPlan> solved_;
  std::optional<int64_t> memoryLimit_;
  bool fault_, replayFault_;
  std::map<std::string, at::Tensor> leaves_;
  std::map<std::pair<int, size_t>, at::Tensor> data_;  // graph inputs, per reader
  at::Tensor seed_;
  std::vector<std::unique_ptr<harness::RedistRunner>> runners_;
  std::map<std::pair<int, size_t>, const PlanEdge*> edgeOf_;  // per (node, operand)
  std::map<std::string, at::Tensor> results_;

  // One forward through the plan, from the leaves as they are; returns the output's piece.
  at::Tensor forward(RankContext& ctx);
  // Node v's forward: operand i as stored (`operand(i)`) through its edge's redistribution,
  // `taken(i)` told once the node holds its operand i (the forward drops a value after its last
  // reader there, before the next operand is redistributed), then the operator. `capture`: the
  // step's capture sees it (a recomputation's does not).
  std::vector<at::Tensor> nodeForward(RankContext& ctx, size_t v,
                                      const std::function<at::Tensor(size_t)>& operand,
                                      const std::function<void(size_t)>& taken, bool& faultDone,
                                      uint64_t seedShift, bool capture);
  // A forward and backward with recompute_ told of it, its end told however the pass ends (a
  // step that throws leaves no observer or hook of the pass behind on the thread).
  void startPass(RankContext& ctx);
  void endPass() {
    if (recompute_) recompute_->endPass();
  }
  struct PassScope {
    PassScope(PlanExecutor& e, RankContext& ctx) : e(e) { e.startPass(ctx); }
    ~PassScope() { e.endPass(); }
    PassScope(const PassScope&) = delete;
    PassScope& operator=(const PassScope&) = delete;
    PlanExecutor& e;
  };
  std::shared_ptr<PlanRecompute> recompute_;
  // Training over the case's steps (reference/training.h): every step() from the initial
  // pieces, LibTorch's optimizer over this rank's pieces; the loss and the gradient norm summed
  // over the ranks, each replicated box counted once. The update is profiled in prepare().
  void trainSteps(RankContext& ctx);
  std::vector<std::pair<std::string, at::Tensor>> namedLeaves() const;
  std::vector<at::Tensor> initialLeaves_;
  std::vector<bool> leafCounted_;
  bool outputCounted_ = true;
  std::unique_ptr<reference::TrainingLoop> loop_;
  int64_t startLive_ = 0, updatePeak_ = 0, stateBytes_ = 0, initialBytes_ = 0;
  // The step's replay (plan_memory.h): its peak above what the executor holds (the parameters'
  // pieces, the data slices, the seed), or why there is none.
  bool replayed_ = false;
  int64_t heldBytes_ = 0, stepPeak_ = 0;
  std::vector<int64_t> liveAfterForward_;  // the replay's, per node (replayPlanStep)
  std::string notReplayed_;
  // Capture: on for the next step (its first optimizer step in training), the pieces it kept.
  bool captureOn_ = false;
  std::unique_ptr<PlanCapture> capture_;
  std::vector<harness::TraceValue> captured_;
  void startCapture(RankContext& ctx) {
    if (captureOn_)
      capture_ = std::make_unique<PlanCapture>(*solved_->model, solved_->plan.choice, ctx, leaves_);
  }
  void endCapture() {
    if (!capture_) return;
    captured_ = capture_->take();
    capture_.reset();
  }
};

}  // namespace sb::strategies::autoshard
