// Data-parallel training with sharded state: `sharding/fsdp/<kind>`, over a case's optimizer
// steps (reference/training.h) on the graph workloads (mlp, gpt2, bert, llama) and imported
// models (torchscript). Every rank takes an equal slice of the batch (dim 0 of every data input
// and of the target); the loss is the sum over the batch, so gradients are summed across ranks,
// never averaged. An imported model runs on each rank as imported at its rows (its shape
// constants folded at that size), its constants (buffers, folded tensors) whole on every rank;
// a model whose operators mix the rows (batch norm) or whose output is not by rows is
// `unsupported`, saying which (fsdp_plan.h: importedUnsupported).
//
//   ddp    parameters, gradients and optimizer state whole on every rank; each gradient
//          all-reduced after the backward (one call per parameter: no buckets)
//   zero1  optimizer state sharded: gradients all-reduced, each rank steps its shard of every
//          parameter, the updated shards all-gathered back into the whole parameters
//   zero2  gradients sharded too: reduce-scattered instead of all-reduced
//   zero3  FSDP: parameters sharded; a unit's (one per block of the workload, plus the root:
//          everything outside the blocks) all-gathered before its forward, freed after it
//          (reshard after forward), all-gathered again before its backward, freed after its
//          last gradient's reduce-scatter (reshard after backward); gradients reduce-scattered
//          as the backward produces them. `params: {reshard_after_forward: false}` keeps each
//          unit gathered from its forward to the end of its backward, gathered once a step
//   hsdp   zero3 on mesh axis 1, replicated over axis 0: gradients reduce-scattered on axis 1,
//          then all-reduced over axis 0
//
// Sharding is FSDP2's: every parameter on its own, along dim 0, in torch.chunk's sizes (a
// parameter with fewer rows than ranks leaves empty shards), all-gathered and reduce-scattered
// with uneven rows. Each rank's optimizer is LibTorch's own over its shards (an elementwise
// update, the whole tensor's on those elements), run by reference::TrainingLoop as the
// reference runs it. The loss is all-reduced each step; the gradient norm (for the record, and
// clipping) is the square root of the shards' squares all-reduced in float64 where the
// optimizer steps shards. What each kind shards, the units and the predicted communication
// are the plan's (fsdp_plan.h); this file is the strategy and runs the executor
// (fsdp_executor.h), whose memory model is fsdp_memory.cpp.
//
// A unit's parameters are gathered by an autograd function (GatherParams) whose backward
// reduce-scatters the unit's summed gradient: the backward of a parameter runs once all its
// uses' gradients are in, as FSDP's post-backward hook does. Resharding frees the gathered
// tensors' storage (the autograd tape keeps the tensors, as FSDP1 does with its flat
// parameter); a hook on every value the unit hands to later units gathers them again into the
// same storage before the unit's backward starts, without bumping the version counter of what
// autograd saved.
//
// Planted faults (tests): "grad_divided_twice" divides every reduced gradient by the world
// size twice (averaging, twice, where the loss is a sum: the gradient norm is off at step 1);
// "stale_shard" steps the optimizer on a copy of the shard taken at prepare, so that the
// shard the next step gathers never changes (step 1's loss is right, every later one wrong).
// "hsdp_wrong_axis" (hsdp on a square mesh) reduce-scatters over the replica axis and all-
// reduces over the shard axis: each rank keeps the rows of its axis-0 index. "replica_unsummed"
// leaves the last parameter's gradient unreduced over the replicas (ddp, zero1: every rank;
// hsdp: axis 0), so its copies step apart. "replica_own_order" (ddp) sums each gradient as
// all-gathered parts, each rank starting from its own: every copy within tolerance of the
// reference, no two the same bits; the replica check names it. "unit_not_resharded" (zero3,
// hsdp) never frees the first block's unit after its forward (it is gathered again before its
// backward, into the storage still there): every number and every collective right, the peak
// over what the memory model promises (modelMemory), and the row fails on that alone.
// "rank_skips_update" (every kind) lets the last rank's optimizer pass over the parameter with
// the most rows (its gradient dropped before the update): that rank's copy or shard of it stays
// where it started, and its norm leaves the others'.
//
// Whole, for now: the strategy (layouts, specification, tolerances, faults) and the executor's
// step share the kinds' and faults' switches; the plan (fsdp_plan.h) and the memory model
// (fsdp_memory.cpp) are already apart. The seam where it could be cut: FsdpStrategy (its
// boxes, specifiedBox and tolerance) from FsdpExecutor's step, through fsdp_executor.h.

#include <ATen/ATen.h>
#include <ATen/native/Resize.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <map>
#include <utility>

#include "harness/comm/comm_site.h"
#include "harness/error.h"
#include "harness/measure/memory.h"
#include "harness/measure/update_profile.h"
#include "harness/registry.h"
#include "reference/autograd_engine.h"
#include "reference/graph.h"
#include "reference/torchscript/import.h"
#include "reference/training.h"
#include "strategies/sharding/auto/plan_trace.h"
#include "strategies/sharding/fsdp/fsdp_executor.h"
#include "strategies/sharding/fsdp/fsdp_plan.h"
#include "strategies/sharding/layout/spec_boxes.h"

namespace sb::strategies::fsdp {
namespace {

using harness::Applicability;
using harness::Box;
using harness::CaseSpec;
using harness::Collective;
using harness::CommStats;
using harness::RankContext;
using reference::Graph;

class FsdpStrategy final : public harness::Strategy {
 public:
  FsdpStrategy(Kind kind, Fault fault, sac::SacFault sacFault = sac::SacFault::kNone)
      : Strategy(std::string("sharding/fsdp/") + kindName(kind),
                 std::string("fsdp ") + kindName(kind), harness::Family::kFsdp),
        kind_(kind),
        fault_(fault),
        sacFault_(sacFault) {}
  Kind kind() const { return kind_; }
  Fault fault() const { return fault_; }
  bool trainsSteps() const override { return true; }
  std::vector<std::string> caseParams() const override {
    if (shardsParams(kind_)) return {"reshard_after_forward", "prefetch", "param_dtype", "sac"};
    return {"sac"};
  }

  std::vector<std::pair<std::string, std::string>> params() const override {
    return {{"kind", kindName(kind_)},
            {"parameters", shardsParams(kind_) ? "sharded dim 0 (torch.chunk), per unit" : "whole"},
            {"gradients", shardsGrads(kind_) ? "reduce-scattered" : "all-reduced"},
            {"optimizer state", shardsState(kind_) ? "sharded" : "whole"},
            {"mesh", kind_ == Kind::kHsdp ? "2-D: replicate axis 0, shard axis 1" : "any"}};
  }

  void checkParams(const CaseSpec& c) const override {
    checkSac(c);
    if (!shardsParams(kind_)) return;  // ddp, zero1, zero2 read none of the keys below
    if (c.params.contains("reshard_after_forward") &&
        !c.params["reshard_after_forward"].is_boolean()) {
      throw harness::InputError("params.reshard_after_forward must be true or false, got " +
                                c.params["reshard_after_forward"].dump());
    }
    if (c.params.contains("prefetch") && prefetchDepth(c) < 0) {
      throw harness::InputError("params.prefetch must be a whole number of units, 0 to 8, got " +
                                c.params["prefetch"].dump());
    }
    if (c.params.contains("param_dtype") && !paramDtype(c)) {
      throw harness::InputError(
          "params.param_dtype must be bfloat16 or float32 (the case's dtype), got " +
          c.params["param_dtype"].dump());
    }
  }

  static void checkSac(const CaseSpec& c) {
    if (!c.params.contains("sac")) return;
    try {
      sac::checkPolicySpec(c.params.at("sac"));
    } catch (const std::invalid_argument& e) {
      throw harness::InputError(c.where() + ": params.sac" + sacKeyPath(e.what()));
    }
  }

  Applicability applies(const CaseSpec& c) const override {
    if (!reference::hasTrainingReference(c.workload) || !reference::findGraphWorkload(c.workload)) {
      return Applicability::notApplicable("not a graph workload with a training reference");
    }
    const bool imported = c.workload == "torchscript";
    if (!c.training.enabled()) {
      return Applicability::unsupported(
          "FSDP and ZeRO shard the optimizer's state: the case needs steps: N (and optimizer)");
    }
    if (fault_ == Fault::kUnitNotResharded && !reshardAfterForward(c)) {
      return Applicability::unsupported(
          "unit_not_resharded plants a missing reshard after the forward; the case keeps units "
          "gathered (reshard_after_forward: false)");
    }
    if (c.params.contains("param_dtype")) {
      if (!shardsParams(kind_)) {
        return Applicability::unsupported(
            "params.param_dtype is FSDP2's mixed precision, of the units it gathers: zero3 and "
            "hsdp");
      }
      if (*paramDtype(c) != c.dtype && c.dtype != at::kFloat) {
        return Applicability::unsupported(
            "mixed precision keeps the shards, gradients and optimizer in float32: "
            "params.param_dtype "
            "needs a float32 case");
      }
      if (*paramDtype(c) != c.dtype && c.workload == "torchscript") {
        return Applicability::unsupported(
            "params.param_dtype on an imported model: its graph's operators run in the case's "
            "dtype, with no casts of their inputs to the units' bfloat16 (torch/fsdp2 runs "
            "FSDP2's MixedPrecisionPolicy on it)");
      }
    }
    if (kind_ == Kind::kHsdp && c.mesh.size() != 2) {
      return Applicability::unsupported(
          "hsdp shards on mesh axis 1 and replicates on axis 0: "
          "it needs a 2-D mesh, the case has " +
          c.meshString());
    }
    if (const auto why = sacUnsupported(c); !why.empty()) return Applicability::unsupported(why);
    if (imported) {
      const std::string why = importedUnsupported(c);
      if (!why.empty()) return Applicability::unsupported(why);
      return Applicability::yes();
    }
    const auto s = reference::GraphShape::parse(c.workload, c.shape);
    if (s.batch % c.meshSize() != 0) {
      return Applicability::unsupported("the batch (" + std::to_string(s.batch) +
                                        ") does not divide over the " +
                                        std::to_string(c.meshSize()) + " data-parallel ranks");
    }
    if (c.workload != "mlp" && s.dropout > 0) {
      return Applicability::unsupported(
          "dropout: each rank's masks would be the whole batch's "
          "slice; the case needs dropout: 0");
    }
    return Applicability::yes();
  }

  std::unique_ptr<harness::RankExecutor> makeExecutor(const CaseSpec& c) const override {
    return std::make_unique<FsdpExecutor>(kind_, fault_, c, sacFault_);
  }

  // A policy's message for params.sac: "policy.ops: ..." -> ".ops: ...".
  static std::string sacKeyPath(std::string what) {
    return what.rfind("policy", 0) == 0 ? what.substr(6) : ": " + what;
  }

  // params.sac: a selective checkpointing policy (a built-in's name or {default, ops, nodes},
  // docs/checkpointing.md) inside every block's forward. Malformed: InputError naming the key.
  // Why the case cannot run it (or its planted fault), or "".
  std::string sacUnsupported(const CaseSpec& c) const {
    if (!c.params.contains("sac")) {
      return sacFault_ == sac::SacFault::kNone
                 ? ""
                 : "saved_freed_early plants into a selective checkpointing policy: the case "
                   "has none (params.sac), nothing to plant";
    }
    const Graph g = reference::buildGraph(c.workload, c.shape);
    sac::Policy p;
    try {
      p = sac::resolvePolicy(g, c.params.at("sac"));
    } catch (const std::invalid_argument& e) {
      throw harness::InputError(c.where() + ": params.sac" + sacKeyPath(e.what()));
    }
    if (std::all_of(p.region.begin(), p.region.end(), [](int r) { return r < 0; })) {
      return "params.sac: this graph has no repeated blocks, and a policy decides inside blocks: "
             "nothing to checkpoint";
    }
    if (paramDtype(c) && *paramDtype(c) != c.dtype) {
      return "params.sac with mixed precision (params.param_dtype): a recomputation would read "
             "the inputs cast in the pass; not yet";
    }
    if (sacFault_ == sac::SacFault::kSavedFreedEarly) {
      const autoshard::ShardingModel m(g, {1}, autoshard::CostOptions{});
      if (!sac::modelRecompute(m, m.replicatedChoice(), p).savedTwice) {
        return "saved_freed_early: no recomputed tensor has two backward readers here, nothing "
               "to plant";
      }
    }
    return "";
  }
  // The plain graph's first training step, whole (the executors keep their rows of it).
  std::vector<harness::TraceValue> referenceTrace(
      const CaseSpec& c, const reference::WorkloadData& data) const override {
    return autoshard::graphReferenceTrace(reference::buildGraph(c.workload, c.shape), {}, c, data);
  }

  Box resultBox(const std::string&, const CaseSpec&, int) const override {
    TORCH_INTERNAL_ASSERT(false, "fsdp results are boxed by resultBoxOf");
  }
  Box resultBoxOf(const std::string& tensor, const CaseSpec& c, int rank,
                  at::IntArrayRef fullShape) const override {
    const bool param = tensor.rfind("param/", 0) == 0;
    const bool state = tensor.rfind("state/", 0) == 0 && tensor != "state/step";
    if ((param && shardsParams(kind_)) || (state && shardsState(kind_))) {
      const Layout l = Layout::of(kind_, c, rank);
      return harness::chunkBox(fullShape, 0, l.shardParts, l.shardIndex);
    }
    return Box::whole(fullShape);
  }

  // The layout the strategy's name claims, derived from the name and the case's mesh alone
  // through spec_boxes.h (nothing of Layout::of, which the executor and resultBoxOf share), so
  // that a layout wrong in both is a row failure (Strategy::specifiedBox). Sharding is FSDP2's
  // `fully_shard`: each parameter on its own, Shard(0) on the data-parallel mesh, which is
  // ShardedTensor's ChunkShardingSpec(dim=0, placements=[0, ..., W-1]); ZeRO stages 1 and 2
  // shard only the optimizer state so, stage 3 the parameters too, DDP nothing; HSDP is
  // (Replicate(), Shard(0)) on the 2-D mesh [replicate, shard], ColossalAI's [S1, R, ...].
  std::optional<SpecifiedBox> specifiedBox(const std::string& tensor, const CaseSpec& c, int rank,
                                           at::IntArrayRef fullShape) const override {
    const bool param = tensor.rfind("param/", 0) == 0;
    const bool state = tensor.rfind("state/", 0) == 0 && tensor != "state/step";
    if (!(param || state) || fullShape.empty()) return std::nullopt;
    const std::string prefix = "sharding/fsdp/";
    const std::string named = id().rfind(prefix, 0) == 0 ? id().substr(prefix.size()) : id();
    const bool shardsParameters = named == "zero3" || named == "hsdp";
    const bool shardsOptimizerState = shardsParameters || named == "zero1" || named == "zero2";
    TORCH_CHECK(shardsOptimizerState || named == "ddp", "`", id(),
                "` names none of ddp, zero1, zero2, zero3, hsdp");
    const std::string what = param ? "parameter" : "optimizer state";
    if (!(param ? shardsParameters : shardsOptimizerState)) {
      return SpecifiedBox{harness::Box{std::vector<int64_t>(fullShape.size(), 0), fullShape.vec()},
                          named + ": the " + what + " whole on every rank"};
    }
    if (named == "hsdp") {
      std::string sequence = "[S1";
      for (size_t d = 1; d < fullShape.size(); ++d) sequence += ", R";
      sequence += "]";
      return SpecifiedBox{harness::colossalSequenceBox(sequence, fullShape, c.mesh, rank),
                          "hsdp: the " + what +
                              " as (Replicate(), Shard(0)) on the mesh [replicate, shard] "
                              "(ColossalAI " +
                              sequence + ")"};
    }
    std::vector<int> placements(static_cast<size_t>(c.meshSize()));
    for (size_t r = 0; r < placements.size(); ++r) placements[r] = static_cast<int>(r);
    return SpecifiedBox{harness::chunkSpecBox(0, placements, fullShape, rank),
                        named + ": the " + what +
                            " as FSDP2's Shard(0), ChunkShardingSpec(dim=0, placements=[0, ..., " +
                            std::to_string(placements.size() - 1) + "])"};
  }

  CommStats predictComm(const CaseSpec& c, int rank) const override {
    return fsdp::predictComm(kind_, fault_, c, rank);
  }
  std::optional<std::vector<harness::NodeComm>> predictCommByNode(const CaseSpec& c,
                                                                  int rank) const override {
    return fsdp::predictCommByNode(kind_, fault_, c, rank);
  }
  // Every row's peak per rank to the byte (FsdpExecutor::modelMemory).
  PredictionTolerance predictionTolerance() const override {
    return PredictionTolerance::exactMemory();
  }

  harness::Tolerance tolerance(const std::string& tensor, const CaseSpec& c,
                               const at::Tensor& expected) const override;
  // Mixed precision: the units compute in params.param_dtype.
  std::optional<at::ScalarType> arithmeticDtype(const CaseSpec& c) const override {
    const auto d = paramDtype(c);
    return d && *d != c.dtype ? d : std::nullopt;
  }

  std::vector<std::string> plantableFaults() const override {
    std::vector<std::string> out;
    for (Fault f : kFaults) {
      if (takesFault(kind_, f)) out.push_back(faultName(f));
    }
    // Into params.sac's policy: a recomputed tensor let go after its first reader. (Dropout
    // recomputed without its seed has nothing to plant: the data-parallel cases run dropout 0.)
    out.push_back(kSacFreed);
    return out;
  }
  std::unique_ptr<harness::Strategy> withPlantedFault(const std::string& name) const override {
    for (Fault f : kFaults) {
      if (takesFault(kind_, f) && name == faultName(f))
        return std::make_unique<FsdpStrategy>(kind_, f);
    }
    if (name == kSacFreed) {
      return std::make_unique<FsdpStrategy>(kind_, Fault::kNone, sac::SacFault::kSavedFreedEarly);
    }
    return nullptr;
  }

 private:
  static constexpr const char* kSacFreed = "saved_freed_early";
  Kind kind_;
  Fault fault_;
  sac::SacFault sacFault_;
};

harness::Tolerance FsdpStrategy::tolerance(const std::string& tensor, const CaseSpec& c,
                                           const at::Tensor& expected) const {
  // Not bitwise even with exact inputs: the workloads' GELU, softmax and layer norm leave the
  // integers, and the loss is a sum over the batch split over the ranks.
  // Each rank sums its slice of the batch and the ranks' sums are added: another order than
  // the reference's, in every gradient, every step. The rounding of step k's gradients moves
  // step k+1's parameters and everything after; the tolerance grows with the steps taken.
  const at::ScalarType computed = paramDtype(c).value_or(c.dtype);
  harness::Tolerance t = harness::stepsTolerance(
      computed, c.training.steps, expected.numel() ? expected.abs().max().item<double>() : 0.0);
  t.reason = "the batch's sum split over " + std::to_string(c.meshSize()) +
             " ranks, compounded over " + std::to_string(c.training.steps) +
             " steps: 10 x steps x the dtype's tolerance";
  if (computed != c.dtype) {
    t.reason += " (bfloat16's: the forward and backward run in it, against a float32 reference)";
  }
  (void)tensor;
  return t;
}

}  // namespace

at::Tensor GatherParam::forward(torch::autograd::AutogradContext* ctx, const at::Tensor& shard,
                                int64_t executor, int64_t index) {
  ctx->saved_data["executor"] = executor;
  ctx->saved_data["index"] = index;
  harness::saveCommNode(ctx);
  return reinterpret_cast<FsdpExecutor*>(executor)->gather(static_cast<int>(index), shard);
}

torch::autograd::variable_list GatherParam::backward(torch::autograd::AutogradContext* ctx,
                                                     torch::autograd::variable_list grads) {
  auto* e = reinterpret_cast<FsdpExecutor*>(ctx->saved_data["executor"].toInt());
  const int index = static_cast<int>(ctx->saved_data["index"].toInt());
  const auto site = harness::backwardCommSite(ctx);
  return {e->reduceGrad(index, grads[0]), at::Tensor(), at::Tensor()};
}

FsdpExecutor::FsdpExecutor(Kind kind, Fault fault, CaseSpec c, sac::SacFault sacFault)
    : case_(std::move(c)), kind_(kind), fault_(fault), sacFault_(sacFault) {
  reshardAfterForward_ = reshardAfterForward(case_);
  prefetch_ = prefetchDepth(case_);
  paramDtype_ = paramDtype(case_).value_or(case_.dtype);
}

void FsdpExecutor::prepare(RankContext& ctx, const reference::WorkloadData& data) {
  ctx_ = &ctx;
  layout_ = Layout::of(kind_, case_, ctx.rank());
  const Graph full = reference::buildGraph(case_.workload, case_.shape);
  local_ = reference::buildGraph(case_.workload, rankShape(case_, layout_.world));
  units_ = Units::of(local_);
  // This rank's slice of the batch: dim 0 of every data input and of the target. An imported
  // model's constants (a causal mask, rotary tables, positions: buffers and tensors folded from
  // the trace) are not data: every rank holds them as the model imported at its rows folds
  // them.
  const auto slice = [&](const at::Tensor& t) {
    const int64_t rows = t.size(0) / layout_.world;
    return t.narrow(0, ctx.rank() * rows, rows).clone();
  };
  std::map<std::string, reference::torchscript::ImportedModel::Constant> constants;
  if (case_.workload == "torchscript") {
    constants = reference::torchscript::importModel(
                    reference::torchscript::ImportSpec::fromJson(local_.importShape))
                    ->constants;
  }
  for (const auto& [name, dims] : local_.inputs) {
    const auto c = constants.find(name);
    if (c == constants.end()) {
      inputs_[name] = slice(data.inputs.at(name));
    } else {
      inputs_[name] = reference::torchscript::importedConstant(c->second, case_.dtype);
      constants_.insert(name);
    }
  }
  dataIndex_ = ctx.rank();
  for (const auto& node : local_.nodes) {
    const bool fromData = std::any_of(node.args.begin(), node.args.end(), [&](const auto& a) {
      return (local_.isInput(a) && !constants_.count(a)) || fromData_.count(a);
    });
    if (!fromData) continue;
    for (const auto& o : node.outputs()) {
      fromData_.insert(o);
      // Captured as this rank's rows only where its rows are the batch's (dim 0 the batch or
      // the tokens, split as the batch is); another value from the data is not captured.
      const auto whole = full.valueShape(o), mine = local_.valueShape(o);
      if (!whole.empty() && !mine.empty() && whole[0] == mine[0] * layout_.world) {
        batchRows_.insert(o);
      }
    }
  }
  target_ = slice(data.inputs.at("target"));
  std::map<std::string, int> index;
  for (const auto& [name, dims] : local_.parameters) {
    index[name] = static_cast<int>(names_.size());
    names_.push_back(name);
    unitOf_.push_back(units_.unitOfParam.at(name));
    sizes_.push_back(dims);
    rows_.push_back(harness::chunkSizes(dims.at(0), layout_.shardParts));
    shardRows_.emplace_back(
        harness::chunkOffsets(dims.at(0), layout_.shardParts)[layout_.shardIndex],
        rows_.back()[layout_.shardIndex]);
    const at::Tensor& p = data.inputs.at(name);
    initial_.push_back(shardsParams(kind_)
                           ? p.narrow(0, shardRows_.back().first, shardRows_.back().second).clone()
                           : p.clone());
  }
  unitParams_.assign(units_.names.size(), {});
  unitsEndingAt_.assign(local_.nodes.size(), {});
  for (size_t u = 0; u < units_.names.size(); ++u) {
    for (const auto& name : units_.params[u]) unitParams_[u].push_back(index.at(name));
    if (u > 0 && units_.lastNode[u] >= 0) unitsEndingAt_[units_.lastNode[u]].push_back(u);
  }
  order_ = forwardOrder(units_, local_);
  orderPos_.assign(units_.names.size(), -1);
  for (size_t k = 0; k < order_.size(); ++k) orderPos_[order_[k]] = static_cast<int>(k);
  paramIndex_ = index;
  for (int j = 0; j < static_cast<int>(local_.nodes.size()); ++j) {
    for (const auto& a : local_.nodes[j].args) lastRead_[a] = j;
  }
  // params.sac: the policy on the graph at this rank's batch (the strategy checked it).
  sac::Policy policy;
  if (case_.params.contains("sac")) {
    sacGraph_ = std::make_unique<autoshard::ShardingModel>(local_, std::vector<int64_t>{1},
                                                           autoshard::CostOptions{});
    policy = sac::resolvePolicy(local_, case_.params.at("sac"));
    sacModel_ = sac::modelRecompute(*sacGraph_, sacGraph_->replicatedChoice(), policy);
    sac_ = std::make_shared<sac::SacRuntime>(local_, policy, sacModel_, sacFault_);
  }
  // The profile: one pass on whole parameters, no communication, nothing freed that FSDP
  // frees, the live bytes recorded at each mark (modelMemory adds what FSDP does there).
  {
    full_.clear();
    for (const auto& [name, dims] : local_.parameters) {
      full_.push_back(data.inputs.at(name).to(paramDtype_, false, true).requires_grad_(true));
    }
    shards_ = full_;  // the sharded kinds' GatherParam takes its "shard" from here
    profile_ = true;
    marks_.clear();
    pass();
    mark(MarkKind::kDone, -1);
    profile_ = false;
    full_.clear();
    shards_.clear();
    gathered_.clear();
  }
  // The steps' own runtime: its counts (flops, nodes recomputed) are the first step's.
  if (sac_) sac_ = std::make_shared<sac::SacRuntime>(local_, policy, sacModel_, sacFault_);
  modelMemory(ctx);
}

FsdpExecutor::SacPass::SacPass(FsdpExecutor& x) : e(x) {
  if (!e.sac_) return;
  std::vector<at::Tensor> held;
  for (const auto& [name, t] : e.inputs_) held.push_back(t);
  held.push_back(e.target_);
  for (const auto* ts : {&e.full_, &e.shards_}) {
    for (const auto& t : *ts) {
      if (t.defined()) held.push_back(t);
    }
  }
  // A recomputed node reads the unit's gathered parameters (its storage filled again before
  // the unit's backward), the data, and what the runtime hands it.
  e.sac_->startPass(
      [&x = e](int v, const autoshard::PlanRecompute::Value& value, uint64_t shift) {
        return reference::runNode(
            x.local_.nodes[static_cast<size_t>(v)],
            [&](const std::string& a) -> at::Tensor {
              if (auto it = x.paramIndex_.find(a); it != x.paramIndex_.end()) {
                if (!shardsParams(x.kind_)) return x.full_[it->second];
                // A block's backward can reach a dropped tensor before its unit's re-gather
                // hook fires (a node after the unit's last parameter reader saved it): gathered
                // here then, as FSDP2's pre-backward would have.
                const int u = x.unitOf_[static_cast<size_t>(it->second)];
                if (!x.unitGathered_[static_cast<size_t>(u)]) x.regatherUnit(u);
                return x.gathered_[it->second];
              }
              if (x.local_.isInput(a)) return x.inputs_.at(a);
              return value(a);
            },
            x.case_.seed + shift);
      },
      held);
}

FsdpExecutor::SacPass::~SacPass() {
  if (e.sac_) e.sac_->endPass();
}

void FsdpExecutor::mark(MarkKind kind, int index, bool contiguous) {
  if (!profile_) return;
  auto& mem = harness::MemoryTracker::instance();
  const int r = ctx_->rank();
  if (kind == MarkKind::kStart) {
    mem.resetPeak(r);
    live0_ = mem.current(r);
  }
  marks_.push_back({kind, index, mem.current(r) - live0_, mem.peak(r) - live0_, contiguous});
  mem.resetPeak(r);
}

at::Tensor FsdpExecutor::gather(int index, const at::Tensor& shard) {
  // The profile's "shard" is the whole parameter: an alias, allocating nothing.
  if (profile_) return shard.alias();
  if (prefetched_[index].defined()) return std::exchange(prefetched_[index], at::Tensor());
  // Mixed precision: the shard cast to the parameter dtype, and gathered in it.
  const at::Tensor part = mixed() ? shard.to(paramDtype_) : shard.contiguous();
  // At its unit, whenever it runs (a prefetch runs in the unit before; forward or backward).
  const harness::CommSiteScope site(units_.names[unitOf_[index]]);
  return shardComm().allGather(part, rowsOf(index)).view(sizes_[index]);
}

at::Tensor FsdpExecutor::reduceGrad(int index, const at::Tensor& full) {
  mark(MarkKind::kGradReady, index, full.is_contiguous());
  const int unit = unitOf_[index];
  at::Tensor g;
  if (!profile_) {
    const harness::CommSiteScope site(units_.names[unit]);
    const bool wrongAxis = fault_ == Fault::kHsdpWrongAxis;
    auto& comm = kind_ == Kind::kHsdp ? ctx_->group({wrongAxis ? 0 : 1}) : ctx_->world();
    // Mixed precision: reduced in the shards' dtype (float32), from one contiguous copy.
    g = comm.reduceScatter(
        mixed() ? at::empty(full.sizes(), full.options().dtype(case_.dtype)).copy_(full)
                : full.contiguous(),
        rowsOf(index));
    const bool unsummed =
        fault_ == Fault::kReplicaUnsummed && index + 1 == static_cast<int>(names_.size());
    if (kind_ == Kind::kHsdp && !unsummed) ctx_->group({wrongAxis ? 1 : 0}).allReduce(g);
    if (fault_ == Fault::kGradDividedTwice) {
      g.div_(static_cast<double>(layout_.world * layout_.world));
    }
  }
  // The unit's last gradient reduced: its backward is over, its parameters are freed (FSDP's
  // post-backward reshard). The profile hands no gradient on: the whole one is freed as FSDP
  // frees it, after its reduce-scatter.
  if (--unitPending_[unit] == 0 && unitGathered_[unit]) reshardUnit(unit);
  return g;
}

void FsdpExecutor::gatherUnit(int unit, std::map<std::string, at::Tensor>& values) {
  mark(MarkKind::kGather, unit);
  gatherParams(unit, values);
  // Forward prefetch: the next units in forward order, gathered now (the profile does not:
  // the model places them itself).
  if (profile_ || unit == 0) return;
  // Only the all-gathers are issued early: each unit's autograd function is made at its own
  // forward, so that the backward runs its reductions in the same order (FSDP2's way).
  for (int d = 1; d <= prefetch_ && orderPos_[unit] + d < static_cast<int>(order_.size()); ++d) {
    const int next = order_[orderPos_[unit] + d];
    if (unitGathered_[next]) continue;
    for (int i : unitParams_[next]) prefetched_[i] = gather(i, shards_[i].detach());
    unitGathered_[next] = true;
  }
}

void FsdpExecutor::gatherParams(int unit, std::map<std::string, at::Tensor>& values) {
  for (int i : unitParams_[unit]) {
    gathered_[i] = GatherParam::apply(shards_[i], reinterpret_cast<int64_t>(this), i);
    values[names_[i]] = gathered_[i];
    if (sac_) sac_->hold(gathered_[i]);  // the unit's: saved by reference, never recomputed
  }
  unitGathered_[unit] = true;
}

// Frees the unit's gathered storage; autograd keeps the tensors (and their views).
void FsdpExecutor::reshardUnit(int unit, bool free) {
  if (!profile_ && free) {
    for (int i : unitParams_[unit]) {
      at::native::resize_bytes_cpu(gathered_[i].storage().unsafeGetStorageImpl(), 0);
    }
  }
  unitGathered_[unit] = false;
}

// Gathers the unit's parameters again, into the storage autograd's saved tensors share, through
// an alias of its own (whose writes bump no saved tensor's version).
void FsdpExecutor::regatherUnit(int unit) {
  if (!unitGathered_[unit]) {
    mark(MarkKind::kRegather, unit);
    regatherParams(unit);
  }
  // Backward prefetch: the units whose backward comes next (the previous ones in forward
  // order), where they still have gradients to reduce.
  if (profile_) return;
  for (int d = 1; d <= prefetch_ && orderPos_[unit] - d >= 0; ++d) {
    const int prev = order_[orderPos_[unit] - d];
    if (!unitGathered_[prev] && unitPending_[prev] > 0) regatherParams(prev);
  }
}

void FsdpExecutor::regatherParams(int unit) {
  unitGathered_[unit] = true;
  if (profile_) return;
  for (int i : unitParams_[unit]) {
    at::Tensor& t = gathered_[i];
    at::native::resize_bytes_cpu(t.storage().unsafeGetStorageImpl(), t.nbytes());
    at::Tensor alias = at::empty({0}, t.options().requires_grad(false));
    alias.set_(t.storage(), t.storage_offset(), t.sizes(), t.strides());
    at::NoGradGuard noGrad;
    alias.copy_(gather(i, shards_[i].detach()));
  }
}

double FsdpExecutor::pass() {
  const int n = static_cast<int>(names_.size());
  mark(MarkKind::kStart, -1);
  double result = 0;
  {
    const SacPass sacPass(*this);
    // Forward, unit by unit where parameters are sharded.
    std::map<std::string, at::Tensor> values = inputs_;
    if (mixed()) {  // the root's floating inputs cast, as FSDP2's pre-forward does
      for (auto& [name, t] : values) {
        if (at::isFloatingType(t.scalar_type()) && !constants_.count(name)) t = t.to(paramDtype_);
      }
    }
    unitGathered_.assign(units_.names.size(), false);
    unitPending_.assign(units_.names.size(), 0);
    for (int i = 0; i < n; ++i) ++unitPending_[unitOf_[i]];
    gathered_.assign(n, at::Tensor());
    prefetched_.assign(n, at::Tensor());
    if (shardsParams(kind_)) {
      gatherUnit(0, values);  // the root: gathered until its backward is over
    } else {
      for (int i = 0; i < n; ++i) values[names_[i]] = full_[i];
    }
    for (int j = 0; j < static_cast<int>(local_.nodes.size()); ++j) {
      const auto& node = local_.nodes[j];
      if (shardsParams(kind_)) {
        for (const auto& a : node.args) {
          if (!local_.isParameter(a)) continue;
          const int u = units_.unitOfParam.at(a);
          if (u != 0 && !values.count(a)) gatherUnit(u, values);
        }
      }
      std::vector<at::Tensor> ys;
      {
        const auto hooks = sac_ ? sac_->nodeHooks(j) : nullptr;
        ys = reference::runNode(
            node, [&](const std::string& a) { return values.at(a); }, case_.seed);
      }
      if (sac_) sac_->nodeDone(j, ys);
      // A value goes after its last reader, as a PyTorch module's intermediates do (what autograd
      // saved of it stays, or goes, by the node that saved it: a checkpointing policy's choice).
      for (const auto& a : node.args) {
        if (!local_.isParameter(a) && !local_.isInput(a) && a != local_.output &&
            lastRead_.at(a) == j) {
          values.erase(a);
        }
      }
      const auto outs = node.outputs();
      for (size_t i = 0; i < ys.size(); ++i) values[outs[i]] = ys[i];
      if (tape_) {
        for (size_t i = 0; i < ys.size(); ++i) {
          if (!fromData_.count(outs[i])) {
            tape_->keep(node.name, "forward", outs[i], ys[i], harness::Box::whole(ys[i].sizes()));
            continue;
          }
          if (!batchRows_.count(outs[i])) continue;
          tape_->keep(node.name, "forward", outs[i], ys[i], batchBox(ys[i]));
          tape_->hookGradient(node.name, outs[i], ys[i], batchBox(ys[i]));
        }
      }
      if (!shardsParams(kind_)) continue;
      // After a unit's last node: reshard, and gather again when the gradient of anything it
      // hands on arrives.
      for (int u : unitsEndingAt_[j]) {
        for (const auto& name : units_.params[u]) values.erase(name);
        if (!reshardAfterForward_) continue;
        for (const auto& v : units_.handedOn[u]) {
          const at::Tensor& val = values.at(v);
          if (!val.requires_grad()) continue;
          val.register_hook([this, u](const at::Tensor& grad) {
            regatherUnit(u);
            return grad;
          });
        }
        mark(MarkKind::kUnitEnd, u);
        // The fault: marked resharded, never freed (gathered again into storage still there).
        reshardUnit(u, !(fault_ == Fault::kUnitNotResharded && u == 1));
      }
    }
    const at::Tensor out = values.at(local_.output);
    values.clear();
    const at::Tensor loss = (out * target_).sum();
    reference::backward({loss});
    mark(MarkKind::kBackwardEnd, -1);
    at::Tensor total = loss.detach().clone();
    if (!profile_) {
      const harness::CommSiteScope site("", harness::StepPhase::kUpdate);
      ctx_->world().allReduce(total);
    }
    result = total.item<double>();
  }
  return result;
}

void FsdpExecutor::makeParams() {
  const int n = static_cast<int>(names_.size());
  full_.assign(n, at::Tensor());
  shards_.assign(n, at::Tensor());
  for (int i = 0; i < n; ++i) {
    const at::Tensor& p = initial_[i];
    if (!shardsParams(kind_)) full_[i] = p.clone().requires_grad_(true);
    if (shardsParams(kind_)) {
      shards_[i] = p.clone().requires_grad_(true);
    } else if (shardsState(kind_)) {
      const auto [off, len] = shardRows(i);
      shards_[i] = p.narrow(0, off, len).clone().requires_grad_(true);
    }
  }
}

void FsdpExecutor::step(RankContext& ctx) {
  ctx_ = &ctx;
  auto& mem = harness::MemoryTracker::instance();
  entryLive_ = mem.current(ctx.rank());
  // Every step() trains from the initial parameters, with a new optimizer: the last one's
  // training let go of first.
  loop_.reset();
  full_.clear();
  shards_.clear();
  staleShards_.clear();
  gathered_.clear();
  startLive_ = mem.current(ctx.rank());
  makeParams();
  const int n = static_cast<int>(names_.size());
  std::vector<std::pair<std::string, at::Tensor>> stepped;  // what the optimizer updates
  for (int i = 0; i < n; ++i) {
    stepped.emplace_back(names_[i], shardsState(kind_) ? shards_[i] : full_[i]);
  }
  if (fault_ == Fault::kStaleShard && shardsState(kind_)) {
    for (auto& [name, s] : stepped) {
      staleShards_.push_back(s.detach().clone().requires_grad_(true));
      s = staleShards_.back();
    }
  }
  loop_ = std::make_unique<reference::TrainingLoop>(case_.training, stepped);
  // Where the optimizer steps shards, the norm is the shards' squares summed over the group
  // that holds one copy of every row.
  if (shardsState(kind_)) harness::shareNormOver(*loop_, std::vector<bool>(n, true), shardComm());
  auto& world = ctx.world();
  for (int k = 0; k < case_.training.steps; ++k) {
    for (auto* ts : {&full_, &shards_}) {
      for (auto& t : *ts) {
        if (t.defined()) t.mutable_grad() = at::Tensor();
      }
    }
    if (captureOn_ && k == 0) tape_ = std::make_unique<harness::CaptureTape>();
    const double loss = pass();
    // Gradients: reduced, and where the optimizer steps a shard, that shard's.
    if (!shardsParams(kind_)) {
      for (int i = 0; i < n; ++i) {
        const harness::CommSiteScope site(units_.names[unitOf_[i]], harness::StepPhase::kUpdate);
        at::Tensor g = full_[i].grad();
        if (kind_ == Kind::kZero2) {
          g = world.reduceScatter(g.contiguous(), rowsOf(i));
        } else if (fault_ == Fault::kReplicaOwnOrder) {
          // Each rank adds the gathered parts starting from its own.
          const at::Tensor parts =
              world.allGather(g.contiguous().view({1, -1}), std::vector<int64_t>(layout_.world, 1));
          at::Tensor sum = parts[ctx.rank()].clone();
          for (int r = 1; r < layout_.world; ++r) sum.add_(parts[(ctx.rank() + r) % layout_.world]);
          g.copy_(sum.view(g.sizes()));
        } else if (fault_ != Fault::kReplicaUnsummed || i + 1 != n) {
          world.allReduce(g);
        }
        if (fault_ == Fault::kGradDividedTwice) {
          g.div_(static_cast<double>(layout_.world * layout_.world));
        }
        if (kind_ == Kind::kZero1) {
          const auto [off, len] = shardRows(i);
          shards_[i].mutable_grad() = g.narrow(0, off, len).clone();
        } else if (kind_ == Kind::kZero2) {
          shards_[i].mutable_grad() = g;
          full_[i].mutable_grad() = at::Tensor();
        }
      }
    }
    if (tape_) {
      // The parameters' gradients as reduced: a shard's rows, or the whole.
      for (int i = 0; i < n; ++i) {
        const bool shard = shardsParams(kind_) || kind_ == Kind::kZero2;
        const at::Tensor g = shard ? shards_[i].grad() : full_[i].grad();
        if (!g.defined()) continue;
        harness::Box box = harness::Box::whole(g.sizes());
        if (shard) box.offset[0] = shardRows(i).first;
        tape_->keep(names_[i], "backward", "grad " + names_[i], g, box);
      }
      captured_ = tape_->take();
      tape_.reset();
    }
    if (fault_ == Fault::kStaleShard && shardsState(kind_)) {
      for (int i = 0; i < n; ++i) staleShards_[i].mutable_grad() = shards_[i].grad();
    }
    if (fault_ == Fault::kRankSkipsUpdate && ctx.rank() == layout_.world - 1) {
      // The last rank's optimizer passes over the parameter with the most rows (a shard of it
      // is never empty): its gradient let go, as a parameter left out of a rank's optimizer.
      int most = 0;
      for (int i = 1; i < n; ++i) {
        if (sizes_[i].at(0) > sizes_[most].at(0)) most = i;
      }
      stepped[most].second.mutable_grad() = at::Tensor();
    }
    loop_->update(loss);
    // The updated shards back into the whole parameters (zero1, zero2).
    if (kind_ == Kind::kZero1 || kind_ == Kind::kZero2) {
      at::NoGradGuard noGrad;
      for (int i = 0; i < n; ++i) {
        const harness::CommSiteScope site(units_.names[unitOf_[i]], harness::StepPhase::kUpdate);
        full_[i].copy_(world.allGather(shards_[i].detach(), rowsOf(i)).view(full_[i].sizes()));
      }
    }
  }
  gathered_.clear();
}

// Written when asked, not at the end of the step, so that the copies are not in its peak.
std::map<std::string, at::Tensor> FsdpExecutor::results() const {
  std::map<std::string, at::Tensor> out;
  if (!loop_) return out;
  loop_->write(out);
  // The parameters the model computes with: the whole ones where they are not sharded, and
  // the shards themselves (under stale_shard, not what the optimizer stepped).
  for (size_t i = 0; i < names_.size(); ++i) {
    const at::Tensor& held = shardsParams(kind_) ? shards_[i] : full_[i];
    out["param/" + names_[i]] = held.detach();
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> FsdpExecutor::recordParams() const {
  std::vector<std::pair<std::string, std::string>> out = {{"kind", kindName(kind_)},
          {"steps", std::to_string(case_.training.steps)},
          {"optimizer", case_.training.optimizer.toString()},
          {"units", std::to_string(units_.names.size())},
          {"reshard_after_forward",
           shardsParams(kind_) ? (reshardAfterForward_ ? "true" : "false") : "-"},
          {"prefetch", shardsParams(kind_) ? std::to_string(prefetch_) : "-"},
          {"param_dtype", harness::dtypeName(paramDtype_)},
          {"shard_parts", std::to_string(layout_.shardParts)},
          {"replicas", std::to_string(layout_.replicaParts)}};
  if (sac_) {
    for (auto& p : sac::runParams(*sac_, sacModel_, local_)) out.push_back(p);
  }
  return out;
}

std::vector<std::unique_ptr<harness::Strategy>> registerFsdp() {
  std::vector<std::unique_ptr<harness::Strategy>> out;
  for (Kind k : {Kind::kDdp, Kind::kZero1, Kind::kZero2, Kind::kZero3, Kind::kHsdp}) {
    out.push_back(std::make_unique<FsdpStrategy>(k, Fault::kNone));
  }
  return out;
}

}  // namespace sb::strategies::fsdp

SB_REGISTER_STRATEGIES(sb::strategies::fsdp::registerFsdp);
