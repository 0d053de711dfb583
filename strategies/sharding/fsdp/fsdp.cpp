// Data-parallel training with sharded state: `sharding/fsdp/<kind>`, over a case's optimizer
// steps (reference/training.h) on the graph workloads (mlp, gpt2, bert). Every rank takes an
// equal slice of the batch (dim 0 of every data input and of the target); the loss is the sum
// over the batch, so gradients are summed across ranks, never averaged.
//
//   ddp    parameters, gradients and optimizer state whole on every rank; each gradient
//          all-reduced after the backward (one call per parameter: no buckets)
//   zero1  optimizer state sharded: gradients all-reduced, each rank steps its shard of every
//          parameter, the updated shards all-gathered back into the whole parameters
//   zero2  gradients sharded too: reduce-scattered instead of all-reduced
//   zero3  FSDP: parameters sharded; a unit's (one per block of the workload, plus the root:
//          everything outside the blocks) all-gathered before its forward, freed after it
//          (reshard after forward), all-gathered again before its backward; gradients
//          reduce-scattered as the backward produces them
//   hsdp   zero3 on mesh axis 1, replicated over axis 0: gradients reduce-scattered on axis 1,
//          then all-reduced over axis 0
//
// Sharding is FSDP2's: every parameter on its own, along dim 0, in torch.chunk's sizes (a
// parameter with fewer rows than ranks leaves empty shards), all-gathered and reduce-scattered
// with uneven rows. Each rank's optimizer is LibTorch's own over its shards (an elementwise
// update, the whole tensor's on those elements). The loss is all-reduced each step; the
// gradient norm (for the record, and clipping) is the square root of the shards' squares
// all-reduced in float64 where gradients are sharded. What each kind shards, the units and
// the predicted communication are the plan's (fsdp_plan.h); this file runs it.
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
// reference, no two the same bits; the replica check names it.

#include <ATen/ATen.h>
#include <ATen/native/Resize.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/optim/optimizer.h>

#include <map>

#include "harness/registry.h"
#include "reference/autograd_engine.h"
#include "reference/graph.h"
#include "reference/training.h"
#include "strategies/sharding/fsdp/fsdp_plan.h"

namespace sb::strategies::fsdp {
namespace {

using harness::Applicability;
using harness::Box;
using harness::CaseSpec;
using harness::Collective;
using harness::CommStats;
using harness::RankContext;
using reference::Graph;

class FsdpStrategy;

class FsdpExecutor;

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
  FsdpExecutor(const FsdpStrategy& s, CaseSpec c);
  void prepare(RankContext& ctx, const reference::WorkloadData& data) override;
  void step(RankContext& ctx) override;
  std::map<std::string, at::Tensor> results() const override { return results_; }
  std::vector<std::pair<std::string, std::string>> recordParams() const override;

  // GatherParam's halves.
  at::Tensor gather(int index, const at::Tensor& shard);
  at::Tensor reduceGrad(int index, const at::Tensor& full);

 private:
  void gatherUnit(int unit, std::map<std::string, at::Tensor>& values);
  void reshardUnit(int unit);
  void regatherUnit(int unit);
  // Every shard's rows of parameter `index` (torch.chunk's), for its gathers and scatters.
  const std::vector<int64_t>& rowsOf(int index) const { return rows_[index]; }
  // This rank's rows of parameter `index`: {offset, length}.
  std::pair<int64_t, int64_t> shardRows(int index) const { return shardRows_[index]; }

  CaseSpec case_;
  Kind kind_;
  Fault fault_;
  Layout layout_;
  Graph local_;  // the graph at this rank's batch
  Units units_;
  RankContext* ctx_ = nullptr;
  std::map<std::string, at::Tensor> inputs_;  // this rank's data inputs
  at::Tensor target_;
  std::vector<std::string> names_;  // parameters, in graph order
  // From the layout and the graph once, not per collective or node: each parameter's rows per
  // shard and this rank's, each unit's parameter indices, and the units whose forward ends at
  // each node.
  std::vector<std::vector<int64_t>> rows_;
  std::vector<std::pair<int64_t, int64_t>> shardRows_;
  std::vector<std::vector<int>> unitParams_;
  std::vector<std::vector<int>> unitsEndingAt_;
  std::vector<at::Tensor> initialFull_;  // whole initial parameters
  std::vector<at::Tensor> full_;         // ddp/zero1/zero2: whole, replicated leaves
  std::vector<at::Tensor> shards_;       // sharded kinds: this rank's shard leaves
  std::vector<at::Tensor> staleShards_;  // fault stale_shard: what the optimizer steps
  std::vector<at::Tensor> gathered_;     // zero3/hsdp: the unit tensors gathered
  std::vector<bool> unitGathered_;
  std::unique_ptr<torch::optim::Optimizer> opt_;
  std::map<std::string, at::Tensor> results_;
};

class FsdpStrategy final : public harness::Strategy {
 public:
  FsdpStrategy(Kind kind, Fault fault)
      : Strategy(std::string("sharding/fsdp/") + kindName(kind),
                 std::string("fsdp ") + kindName(kind), harness::Family::kSharding),
        kind_(kind),
        fault_(fault) {}
  Kind kind() const { return kind_; }
  Fault fault() const { return fault_; }
  bool trainsSteps() const override { return true; }

  std::vector<std::pair<std::string, std::string>> params() const override {
    return {{"kind", kindName(kind_)},
            {"parameters", shardsParams(kind_) ? "sharded dim 0 (torch.chunk), per unit" : "whole"},
            {"gradients", shardsGrads(kind_) ? "reduce-scattered" : "all-reduced"},
            {"optimizer state", shardsState(kind_) ? "sharded" : "whole"},
            {"mesh", kind_ == Kind::kHsdp ? "2-D: replicate axis 0, shard axis 1" : "any"}};
  }

  Applicability applies(const CaseSpec& c) const override {
    if (!reference::hasTrainingReference(c.workload) || !reference::findGraphWorkload(c.workload)) {
      return Applicability::notApplicable("not a graph workload with a training reference");
    }
    if (!c.training.enabled()) {
      return Applicability::unsupported(
          "FSDP and ZeRO shard the optimizer's state: the case needs steps: N (and optimizer)");
    }
    if (kind_ == Kind::kHsdp && c.mesh.size() != 2) {
      return Applicability::unsupported(
          "hsdp shards on mesh axis 1 and replicates on axis 0: "
          "it needs a 2-D mesh, the case has " +
          c.meshString());
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
    return std::make_unique<FsdpExecutor>(*this, c);
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

  CommStats predictComm(const CaseSpec& c, int rank) const override {
    return fsdp::predictComm(kind_, fault_, c, rank);
  }

  harness::Tolerance tolerance(const std::string& tensor, const CaseSpec& c,
                               const at::Tensor& expected) const override;

  std::vector<std::string> plantableFaults() const override {
    std::vector<std::string> out;
    for (Fault f : kFaults) {
      if (takesFault(kind_, f)) out.push_back(faultName(f));
    }
    return out;
  }
  std::unique_ptr<harness::Strategy> withPlantedFault(const std::string& name) const override {
    for (Fault f : kFaults) {
      if (takesFault(kind_, f) && name == faultName(f))
        return std::make_unique<FsdpStrategy>(kind_, f);
    }
    return nullptr;
  }

 private:
  Kind kind_;
  Fault fault_;
};

harness::Tolerance FsdpStrategy::tolerance(const std::string& tensor, const CaseSpec& c,
                                           const at::Tensor& expected) const {
  // Not bitwise even with exact inputs: the workloads' GELU, softmax and layer norm leave the
  // integers, and the loss is a sum over the batch split over the ranks.
  // Each rank sums its slice of the batch and the ranks' sums are added: another order than
  // the reference's, in every gradient, every step. The rounding of step k's gradients moves
  // step k+1's parameters and everything after; the tolerance grows with the steps taken.
  harness::Tolerance t = harness::stepsTolerance(
      c.dtype, c.training.steps, expected.numel() ? expected.abs().max().item<double>() : 0.0);
  t.reason = "the batch's sum split over " + std::to_string(c.meshSize()) +
             " ranks, compounded over " + std::to_string(c.training.steps) +
             " steps: 10 x steps x the dtype's tolerance";
  (void)tensor;
  return t;
}

at::Tensor GatherParam::forward(torch::autograd::AutogradContext* ctx, const at::Tensor& shard,
                                int64_t executor, int64_t index) {
  ctx->saved_data["executor"] = executor;
  ctx->saved_data["index"] = index;
  return reinterpret_cast<FsdpExecutor*>(executor)->gather(static_cast<int>(index), shard);
}

torch::autograd::variable_list GatherParam::backward(torch::autograd::AutogradContext* ctx,
                                                     torch::autograd::variable_list grads) {
  auto* e = reinterpret_cast<FsdpExecutor*>(ctx->saved_data["executor"].toInt());
  const int index = static_cast<int>(ctx->saved_data["index"].toInt());
  return {e->reduceGrad(index, grads[0]), at::Tensor(), at::Tensor()};
}

FsdpExecutor::FsdpExecutor(const FsdpStrategy& s, CaseSpec c)
    : case_(std::move(c)), kind_(s.kind()), fault_(s.fault()) {}

void FsdpExecutor::prepare(RankContext& ctx, const reference::WorkloadData& data) {
  ctx_ = &ctx;
  layout_ = Layout::of(kind_, case_, ctx.rank());
  const Graph full = reference::buildGraph(case_.workload, case_.shape);
  nlohmann::json localShape = case_.shape;
  localShape["batch"] = full.shape.batch / layout_.world;
  local_ = reference::buildGraph(case_.workload, localShape);
  units_ = Units::of(local_);
  // This rank's slice of the batch: dim 0 of every data input and of the target.
  const auto slice = [&](const at::Tensor& t) {
    const int64_t rows = t.size(0) / layout_.world;
    return t.narrow(0, ctx.rank() * rows, rows).clone();
  };
  for (const auto& [name, dims] : local_.inputs) inputs_[name] = slice(data.inputs.at(name));
  target_ = slice(data.inputs.at("target"));
  std::map<std::string, int> index;
  for (const auto& [name, dims] : local_.parameters) {
    index[name] = static_cast<int>(names_.size());
    names_.push_back(name);
    initialFull_.push_back(data.inputs.at(name).clone());
    rows_.push_back(harness::chunkSizes(dims.at(0), layout_.shardParts));
    shardRows_.emplace_back(
        harness::chunkOffsets(dims.at(0), layout_.shardParts)[layout_.shardIndex],
        rows_.back()[layout_.shardIndex]);
  }
  unitParams_.assign(units_.names.size(), {});
  unitsEndingAt_.assign(local_.nodes.size(), {});
  for (size_t u = 0; u < units_.names.size(); ++u) {
    for (const auto& name : units_.params[u]) unitParams_[u].push_back(index.at(name));
    if (u > 0 && units_.lastNode[u] >= 0) unitsEndingAt_[units_.lastNode[u]].push_back(u);
  }
}

at::Tensor FsdpExecutor::gather(int index, const at::Tensor& shard) {
  auto& comm = kind_ == Kind::kHsdp ? ctx_->group({1}) : ctx_->world();
  const at::Tensor& p = initialFull_[index];
  return comm.allGather(shard.contiguous(), rowsOf(index)).view(p.sizes());
}

at::Tensor FsdpExecutor::reduceGrad(int index, const at::Tensor& full) {
  const bool wrongAxis = fault_ == Fault::kHsdpWrongAxis;
  auto& comm = kind_ == Kind::kHsdp ? ctx_->group({wrongAxis ? 0 : 1}) : ctx_->world();
  at::Tensor g = comm.reduceScatter(full.contiguous(), rowsOf(index));
  const bool unsummed =
      fault_ == Fault::kReplicaUnsummed && index + 1 == static_cast<int>(names_.size());
  if (kind_ == Kind::kHsdp && !unsummed) ctx_->group({wrongAxis ? 1 : 0}).allReduce(g);
  if (fault_ == Fault::kGradDividedTwice)
    g.div_(static_cast<double>(layout_.world * layout_.world));
  return g;
}

void FsdpExecutor::gatherUnit(int unit, std::map<std::string, at::Tensor>& values) {
  for (int i : unitParams_[unit]) {
    gathered_[i] = GatherParam::apply(shards_[i], reinterpret_cast<int64_t>(this), i);
    values[names_[i]] = gathered_[i];
  }
  unitGathered_[unit] = true;
}

// Frees the unit's gathered storage; autograd keeps the tensors (and their views).
void FsdpExecutor::reshardUnit(int unit) {
  for (int i : unitParams_[unit]) {
    at::native::resize_bytes_cpu(gathered_[i].storage().unsafeGetStorageImpl(), 0);
  }
  unitGathered_[unit] = false;
}

// Gathers the unit's parameters again, into the storage autograd's saved tensors share, through
// an alias of its own (whose writes bump no saved tensor's version).
void FsdpExecutor::regatherUnit(int unit) {
  if (unitGathered_[unit]) return;
  for (int i : unitParams_[unit]) {
    at::Tensor& t = gathered_[i];
    at::native::resize_bytes_cpu(t.storage().unsafeGetStorageImpl(), t.nbytes());
    at::Tensor alias = at::empty({0}, t.options().requires_grad(false));
    alias.set_(t.storage(), t.storage_offset(), t.sizes(), t.strides());
    at::NoGradGuard noGrad;
    alias.copy_(gather(i, shards_[i].detach()));
  }
  unitGathered_[unit] = true;
}

void FsdpExecutor::step(RankContext& ctx) {
  ctx_ = &ctx;
  const int n = static_cast<int>(names_.size());
  // Every step() trains from the initial parameters, with a new optimizer.
  full_.assign(n, at::Tensor());
  shards_.assign(n, at::Tensor());
  gathered_.assign(n, at::Tensor());
  std::vector<at::Tensor> stepped;  // what the optimizer updates
  for (int i = 0; i < n; ++i) {
    const at::Tensor& p = initialFull_[i];
    if (!shardsParams(kind_)) full_[i] = p.clone().requires_grad_(true);
    if (shardsState(kind_)) {
      const auto [off, len] = shardRows(i);
      shards_[i] = p.narrow(0, off, len).clone().requires_grad_(true);
    }
    stepped.push_back(shardsState(kind_) ? shards_[i] : full_[i]);
  }
  if (fault_ == Fault::kStaleShard && shardsState(kind_)) {
    staleShards_.clear();
    for (auto& s : stepped) {
      staleShards_.push_back(s.detach().clone().requires_grad_(true));
      s = staleShards_.back();
    }
  }
  opt_ = reference::makeOptimizer(case_.training.optimizer, stepped);
  std::vector<double> losses, norms;
  auto& world = ctx.world();
  auto& shardGroup = kind_ == Kind::kHsdp ? ctx.group({1}) : ctx.world();
  for (int k = 0; k < case_.training.steps; ++k) {
    for (auto& t : full_) {
      if (t.defined()) t.mutable_grad() = at::Tensor();
    }
    for (auto& t : shards_) {
      if (t.defined()) t.mutable_grad() = at::Tensor();
    }
    // Forward, unit by unit where parameters are sharded.
    std::map<std::string, at::Tensor> values = inputs_;
    unitGathered_.assign(units_.names.size(), false);
    if (shardsParams(kind_)) {
      gatherUnit(0, values);  // the root: gathered for the whole step
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
      const auto ys = reference::runNode(
          node, [&](const std::string& a) { return values.at(a); }, case_.seed);
      const auto outs = node.outputs();
      for (size_t i = 0; i < ys.size(); ++i) values[outs[i]] = ys[i];
      if (!shardsParams(kind_)) continue;
      // After a unit's last node: reshard, and gather again when the gradient of anything it
      // hands on arrives.
      for (int u : unitsEndingAt_[j]) {
        for (const auto& v : units_.handedOn[u]) {
          const at::Tensor& val = values.at(v);
          if (!val.requires_grad()) continue;
          val.register_hook([this, u](const at::Tensor& grad) {
            regatherUnit(u);
            return grad;
          });
        }
        reshardUnit(u);
        for (const auto& name : units_.params[u]) values.erase(name);
      }
    }
    const at::Tensor out = values.at(local_.output);
    values.clear();
    at::Tensor loss = (out * target_).sum();
    reference::backward({loss});
    at::Tensor total = loss.detach().clone();
    world.allReduce(total);
    losses.push_back(total.item<double>());

    // Gradients: reduced, and where the optimizer steps a shard, that shard's.
    if (!shardsParams(kind_)) {
      for (int i = 0; i < n; ++i) {
        at::Tensor g = full_[i].grad();
        if (kind_ == Kind::kZero2) {
          g = world.reduceScatter(g.contiguous(), rowsOf(i));
        } else if (fault_ == Fault::kReplicaOwnOrder) {
          // Each rank adds the gathered parts starting from its own.
          const at::Tensor parts =
              world.allGather(g.contiguous().view({1, -1}), std::vector<int64_t>(layout_.world, 1));
          at::Tensor sum = parts[ctx.rank()].clone();
          for (int k = 1; k < layout_.world; ++k) sum.add_(parts[(ctx.rank() + k) % layout_.world]);
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
    double sq = reference::gradientSquares(shardsGrads(kind_) ? shards_ : full_);
    if (shardsGrads(kind_)) {
      at::Tensor s = at::tensor({sq}, at::TensorOptions().dtype(at::kDouble));
      shardGroup.allReduce(s);
      sq = s.item<double>();
    }
    const double norm = std::sqrt(sq);
    norms.push_back(norm);
    reference::clipGradients(shardsState(kind_) ? shards_ : full_, norm,
                             case_.training.optimizer.clipGradNorm);
    if (fault_ == Fault::kStaleShard && shardsState(kind_)) {
      for (int i = 0; i < n; ++i) staleShards_[i].mutable_grad() = shards_[i].grad();
    }
    opt_->step();
    // The updated shards back into the whole parameters (zero1, zero2).
    if (kind_ == Kind::kZero1 || kind_ == Kind::kZero2) {
      at::NoGradGuard noGrad;
      for (int i = 0; i < n; ++i) {
        full_[i].copy_(world.allGather(shards_[i].detach(), rowsOf(i)).view(full_[i].sizes()));
      }
    }
  }
  // Results.
  results_.clear();
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  results_["loss"] = at::tensor(losses, f64);
  results_["grad_norm"] = at::tensor(norms, f64);
  for (int i = 0; i < n; ++i) {
    const at::Tensor& held = shardsParams(kind_) ? shards_[i] : full_[i];
    results_["param/" + names_[i]] = held.detach();
    const at::Tensor& stepped = fault_ == Fault::kStaleShard && shardsState(kind_)
                                    ? staleShards_[i]
                                    : (shardsState(kind_) ? shards_[i] : full_[i]);
    for (const auto& [key, t] : reference::optimizerState(*opt_, stepped)) {
      results_["state/" + names_[i] + "/" + key] = t;
    }
    if (i == 0 && case_.training.optimizer.kind == "adamw") {
      results_["state/step"] = at::tensor({reference::optimizerStep(*opt_, stepped)}, f64);
    }
  }
  gathered_.clear();
}

std::vector<std::pair<std::string, std::string>> FsdpExecutor::recordParams() const {
  return {{"kind", kindName(kind_)},
          {"steps", std::to_string(case_.training.steps)},
          {"optimizer", case_.training.optimizer.toString()},
          {"units", std::to_string(units_.names.size())},
          {"shard_parts", std::to_string(layout_.shardParts)},
          {"replicas", std::to_string(layout_.replicaParts)}};
}

std::vector<std::unique_ptr<harness::Strategy>> registerFsdp() {
  std::vector<std::unique_ptr<harness::Strategy>> out;
  for (Kind k : {Kind::kDdp, Kind::kZero1, Kind::kZero2, Kind::kZero3, Kind::kHsdp}) {
    out.push_back(std::make_unique<FsdpStrategy>(k, Fault::kNone));
  }
  return out;
}

}  // namespace
}  // namespace sb::strategies::fsdp

SB_REGISTER_STRATEGIES(sb::strategies::fsdp::registerFsdp);
