// Pipeline parallelism: `pipeline/<schedule>` runs a chain network (mlp_chain, gpt2_stack) cut
// by layers into stages, one per rank of mesh axis 0 (or, interleaved, several), through the
// actions of a schedule (schedule.h): GPipe, Megatron's 1F1B and interleaved 1F1B, Zero Bubble's
// ZB-H1, or a schedule read from torch.distributed.pipelining's CSV. On a 2-D mesh axis 1 is
// data parallel: each replica runs its rows' micro-batches through its pipeline, and the
// parameters' gradients are all-reduced over axis 1 after the step.
//
// An action on stage s and micro-batch m:
//   F  the stage's layers on the micro-batch: stage 0 reads the input's rows, every other stage
//      receives the previous stage's activation (Communicator::recv, tag (s, m)); the output is
//      sent on (isend, waited for at the end of the step, as torch.distributed.pipelining does)
//      or, on the last stage, kept, its gradient the target's rows (the loss is sum(y * target)).
//   B  the stage's backward from the next stage's input gradient (received): every parameter's
//      gradient accumulated in place, the input's gradient sent back (or, on stage 0, kept).
//   I  B's input gradient alone (autograd::grad with the graph kept); W its parameters'
//      gradients from the same graph and output gradient, accumulated in place.
// The reference is the same micro-batches accumulated in order on one rank (the chain
// workloads' shape key `microbatches`): where a schedule accumulates every stage's micro-batches
// in order 0..M-1 (each built in one does) and there is one replica, every tensor is bitwise
// equal; with data parallelism the replicas' sums are added in another order (a tolerance for a
// sum split over the replicas).
//
// Each rank records its actions' start and end in the measured step; the row's details have the
// measured idle time per rank and the bubble (idle rank time over ranks x step) beside the dry
// run's (simulate()) on per-stage costs profiled in prepare (each rank times its stages' F and B,
// or I and W, on one micro-batch; the costs are all-gathered).
//
// Planted faults (tests): "grad_twice" (stage 0 accumulates micro-batch 1's gradients twice),
// "warmup_short" (1F1B with every rank's warm-up one forward short: the last stage's first
// backward comes before its forward, which the dry run names; the run times out naming the
// rank), "w_before_i" (ZB-H1 with stage 0's first W moved before its I: the executor refuses
// it), "send_wrong_stage" (interleaved: stage 0 sends micro-batch 0's activation as stage 2's:
// the receiving rank waits for what never comes, or takes the wrong activation).

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>

#include "harness/error.h"
#include "harness/measure/memory.h"
#include "harness/measure/update_profile.h"
#include "harness/registry.h"
#include "reference/autograd_engine.h"
#include "reference/chain_nets.h"
#include "reference/training.h"
#include "strategies/pipeline/schedule.h"

namespace sb::strategies::pipeline {
namespace {

using harness::Applicability;
using harness::Box;
using harness::CaseSpec;
using harness::Collective;
using harness::CommStats;
using harness::RankContext;

enum class Fault { kNone, kGradTwice, kWarmupShort, kWeightBeforeInput, kSendWrongStage };

const char* faultName(Fault f) {
  switch (f) {
    case Fault::kNone:
      return "none";
    case Fault::kGradTwice:
      return "grad_twice";
    case Fault::kWarmupShort:
      return "warmup_short";
    case Fault::kWeightBeforeInput:
      return "w_before_i";
    case Fault::kSendWrongStage:
      return "send_wrong_stage";
  }
  return "?";
}

// The chain workloads a pipeline runs: no batch norm (a micro-batch's statistics are not the
// batch's) and a known layer count without building the net.
std::optional<int> chainLength(const CaseSpec& c) {
  const auto get = [&](const char* key, int64_t def) {
    return c.shape.is_object() ? c.shape.value(key, def) : def;
  };
  if (c.workload == "mlp_chain") return static_cast<int>(get("depth", 8));
  if (c.workload == "gpt2_stack") return static_cast<int>(get("layers", 4)) + 1;  // and ln_f
  return std::nullopt;
}

// What every rank agrees on, from the case.
struct Plan {
  Schedule schedule;
  int pp = 1, dp = 1;
  int microbatches = 1;  // per replica (the shape's, over the replicas)
  std::vector<int> cut;  // pipeline stage s holds chain stages [cut[s], cut[s + 1])
  bool inOrder = true;   // every stage's gradients accumulated in micro-batch order
};

// The tag of what is sent to stage s for micro-batch m: its activation (kind 0) or the gradient
// of its output (kind 1).
int tagOf(const Plan& p, int stage, int microbatch, int kind) {
  return (stage * p.schedule.microbatches + microbatch) * 2 + kind;
}

class PipelineStrategy;

class PipelineExecutor final : public harness::RankExecutor {
 public:
  PipelineExecutor(const PipelineStrategy& s, const CaseSpec& c);
  void prepare(RankContext& ctx, const reference::WorkloadData& data) override;
  void step(RankContext& ctx) override;
  std::map<std::string, at::Tensor> results() const override { return results_; }
  void settle(RankContext& ctx) override;
  std::optional<double> predictedTimeUs() const override { return predictedStepUs_; }
  std::optional<int64_t> predictedPeakBytes() const override;
  std::vector<std::pair<std::string, std::string>> recordParams() const override;
  nlohmann::json details() const override { return details_; }

 private:
  struct Stash {
    at::Tensor x, y, gy;  // the stage's input (a leaf), output, and output's gradient (I to W)
  };
  at::Tensor stageForward(int stage, const at::Tensor& x) const;
  void run(RankContext& ctx, const Action& a);
  void profile(RankContext& ctx);
  // Each of this rank's stages' actions on micro-batch 0, as run() runs them with its
  // communication stood in (a received tensor allocated as recv's, a sent one held as isend
  // holds it): what each leaves allocated and the most it holds (StageCost::Bytes).
  void profileMemory(RankContext& ctx, Costs& costs);

  CaseSpec case_;
  Fault fault_;
  Plan plan_;
  int p_ = 0, d_ = 0;  // this rank's place on the pipeline and among the replicas
  std::unique_ptr<reference::ChainNet> net_;
  std::vector<at::Tensor> inputs_, targets_;               // this replica's micro-batches
  std::map<int, std::vector<at::Tensor>> stageParams_;     // this rank's stages' parameters
  std::vector<std::pair<std::string, at::Tensor>> owned_;  // (name, parameter)
  std::map<std::string, std::vector<int64_t>> shapes_;     // every parameter's
  std::map<std::pair<int, int>, Stash> stash_;
  std::vector<std::unique_ptr<harness::Communicator::PendingSend>> sends_;
  harness::Communicator* dpComm_ = nullptr;  // mesh axis 1, with data parallelism
  harness::Communicator* worldComm_ = nullptr;
  // Training over the case's steps: the loop over this rank's parameters (reference/training.h),
  // the last stage's micro-batches' losses, and what the update holds (measured).
  bool training_ = false;
  std::unique_ptr<reference::TrainingLoop> loop_;
  std::vector<at::Tensor> initial_;  // this rank's parameters before the first step
  double lossSum_ = 0;
  harness::UpdateProfile update_;
  bool profiling_ = false;        // run() without communication (profileMemory)
  std::vector<at::Tensor> held_;  // what it "sent" meanwhile
  Costs costs_;
  int64_t entryBefore_ = 0, entryAfter_ = 0;  // live bytes at the step's start, and after it let
                                              // the last step's outputs go
  std::vector<at::Tensor> outputs_, gradInputs_;
  std::vector<TimedAction> timeline_;
  // The step's start, and the current action's compute (after what it received).
  std::chrono::steady_clock::time_point start_, computeStart_;
  std::optional<double> predictedStepUs_;
  Simulation predicted_;
  nlohmann::json details_ = nlohmann::json::object();
  std::map<std::string, at::Tensor> results_;
};

class PipelineStrategy final : public harness::Strategy {
 public:
  PipelineStrategy(std::string kind, Fault f)
      : Strategy("pipeline/" + kind, "pipeline " + kind, harness::Family::kSharding),
        kind_(std::move(kind)),
        fault_(f) {}
  const std::string& kind() const { return kind_; }
  Fault fault() const { return fault_; }

  std::vector<std::string> caseParams() const override { return {"virtual_stages", "cut", "csv"}; }
  std::vector<std::pair<std::string, std::string>> params() const override {
    return {{"schedule", kind_},
            {"stages", "mesh axis 0 (interleaved: virtual_stages per rank)"},
            {"case params",
             "virtual_stages (interleaved-1f1b, default 2), cut (layers | balanced: one per "
             "block, gpt2_stack's final layer norm nearly none), csv (pipeline/csv: the "
             "schedule file)"}};
  }

  // The plan a case makes, or why it cannot run: made once per case (a CSV read once), then
  // the same for every call.
  Plan plan(const CaseSpec& c) const {
    const std::string key = c.suite + "\n" + c.name + "\n" + c.meshString() + "\n" +
                            c.shape.dump() + "\n" + c.params.dump();
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = plans_.find(key);
      if (it != plans_.end()) return it->second;
    }
    Plan p = makePlan(c);
    std::lock_guard<std::mutex> lock(mu_);
    plans_.emplace(key, p);
    return p;
  }

  Plan makePlan(const CaseSpec& c) const {
    const auto L = chainLength(c);
    TORCH_CHECK(L, "a pipeline runs mlp_chain or gpt2_stack");
    Plan p;
    p.pp = static_cast<int>(c.mesh.at(0));
    p.dp = c.mesh.size() == 2 ? static_cast<int>(c.mesh[1]) : 1;
    const int64_t total = c.shape.is_object() ? c.shape.value("microbatches", int64_t{1}) : 1;
    TORCH_CHECK(total >= 1 && total <= 100000, "the shape's microbatches must be 1 to 100000, got ",
                total);
    TORCH_CHECK(total % p.dp == 0, "the shape's ", total, " micro-batches do not split over ", p.dp,
                " data-parallel replicas");
    p.microbatches = static_cast<int>(total / p.dp);
    int v = kind_ == "interleaved-1f1b" ? 2 : 1;
    if (c.params.contains("virtual_stages")) {
      const auto& j = c.params["virtual_stages"];
      TORCH_CHECK(j.is_number_integer() && j.get<int64_t>() >= 1 && j.get<int64_t>() <= 64,
                  "params.virtual_stages must be an integer from 1 to 64, got ", j.dump());
      v = static_cast<int>(j.get<int64_t>());
    }
    if (kind_ == "csv") {
      TORCH_CHECK(c.params.contains("csv") && c.params["csv"].is_string(),
                  "pipeline/csv needs params.csv, the schedule file");
      const std::string file = c.params["csv"].get<std::string>();
      std::error_code ec;
      TORCH_CHECK(std::filesystem::is_regular_file(file, ec), "pipeline/csv: cannot read ", file,
                  " (not a regular file)");
      TORCH_CHECK(std::filesystem::file_size(file, ec) <= (16u << 20), "pipeline/csv: ", file,
                  " is over 16 MiB");
      std::ifstream in(file);
      TORCH_CHECK(in, "pipeline/csv: cannot read ", file);
      std::stringstream text;
      text << in.rdbuf();
      p.schedule = readScheduleCsv(text.str(), file);
      TORCH_CHECK(p.schedule.ranks == p.pp, file, " schedules ", p.schedule.ranks,
                  " ranks; the mesh's axis 0 has ", p.pp);
      TORCH_CHECK(p.schedule.microbatches == p.microbatches, file, " has ", p.schedule.microbatches,
                  " micro-batches; the case runs ", p.microbatches, " per replica");
    } else {
      p.schedule = makeSchedule(kind_, p.pp, p.microbatches, v);
    }
    plant(p.schedule);
    validate(p.schedule);
    TORCH_CHECK(p.schedule.stages <= *L, "the chain has ", *L, " layers, fewer than the ",
                p.schedule.stages, " stages");
    for (int s = 0; s + 1 < p.schedule.stages; ++s) {
      TORCH_CHECK(p.schedule.stageRank[s] != p.schedule.stageRank[s + 1], "stages ", s, " and ",
                  s + 1, " are both on rank ", p.schedule.stageRank[s],
                  ": neighbouring stages on one rank (V-shaped schedules) are not run yet");
    }
    const std::string cut =
        c.params.contains("cut") ? c.params["cut"].get<std::string>() : std::string("layers");
    TORCH_CHECK(cut == "layers" || cut == "balanced", "params.cut must be layers or balanced, got ",
                cut);
    if (cut == "layers") {
      p.cut = evenStages(*L, p.schedule.stages);
    } else {
      std::vector<double> cost(static_cast<size_t>(*L), 1.0);
      if (c.workload == "gpt2_stack") cost.back() = 0.01;  // ln_f: a layer norm
      p.cut = balanceStages(cost, p.schedule.stages);
    }
    // In order where every stage's B (or W) run micro-batches 0..M-1.
    for (const auto& actions : p.schedule.perRank) {
      std::map<int, int> next;
      for (const Action& a : actions) {
        if (a.op != Op::kBackward && a.op != Op::kBackwardWeight) continue;
        if (a.microbatch != next[a.stage]++) p.inOrder = false;
      }
    }
    return p;
  }

  Applicability applies(const CaseSpec& c) const override {
    if (!chainLength(c)) {
      return Applicability::notApplicable(
          "not a chain network without batch norm (mlp_chain, gpt2_stack)");
    }
    if (c.mesh.size() > 2 || c.mesh.at(0) < 2) {
      return Applicability::unsupported(
          "a pipeline runs on 2 ranks or more of a 1-D mesh, or "
          "of axis 0 of a 2-D one (axis 1 data parallel); the case "
          "has " +
          c.meshString());
    }
    if (c.shape.is_object() && c.shape.value("dropout", 0.1) != 0.0) {
      return Applicability::unsupported(
          "dropout must be 0: the stages draw their masks in another order than the reference");
    }
    try {
      plan(c);
    } catch (const std::exception& e) {
      std::string msg = e.what();
      if (auto* ce = dynamic_cast<const c10::Error*>(&e)) msg = ce->what_without_backtrace();
      return Applicability::unsupported(msg);
    }
    return Applicability::yes();
  }

  std::unique_ptr<harness::RankExecutor> makeExecutor(const CaseSpec& c) const override {
    return std::make_unique<PipelineExecutor>(*this, c);
  }
  bool trainsSteps() const override { return true; }

  Box resultBox(const std::string&, const CaseSpec&, int) const override {
    TORCH_INTERNAL_ASSERT(false, "pipeline results are boxed by resultBoxOf");
  }
  // Output and input gradient: the replica's rows, on the rank of the last (first) stage;
  // a parameter's gradient whole on the rank of its stage; nothing elsewhere.
  Box resultBoxOf(const std::string& tensor, const CaseSpec& c, int rank,
                  at::IntArrayRef shape) const override {
    const Plan p = plan(c);
    const int pipeRank = rank / p.dp, replica = rank % p.dp;
    Box box = Box::whole(shape);
    const auto none = [&] {
      Box b = Box::whole(shape);
      if (!b.length.empty()) b.length[0] = 0;
      return b;
    };
    if (tensor == "rng/cpu" || tensor == "rng/cuda" || harness::isWholeTrainingResult(tensor)) {
      return box;
    }
    if (tensor == "output" || tensor == "grad_input") {
      const int stage = tensor == "output" ? p.schedule.stages - 1 : 0;
      if (p.schedule.stageRank[stage] != pipeRank) return none();
      const int64_t rows = shape[0] / p.dp;
      box.offset[0] = replica * rows;
      box.length[0] = rows;
      return box;
    }
    const std::string name = tensor.substr(tensor.find('/') + 1);
    const int layer = layerOf(c, name);
    const int stage =
        static_cast<int>(std::upper_bound(p.cut.begin(), p.cut.end(), layer) - p.cut.begin() - 1);
    return p.schedule.stageRank[stage] == pipeRank ? box : none();
  }

  // The chain stage a parameter belongs to: its name's first component is the stage's name
  // (mlp_chain's layer<i>, gpt2_stack's h<l> and ln_f).
  static int layerOf(const CaseSpec& c, const std::string& name) {
    const std::string head = name.substr(0, name.find('.'));
    if (head == "ln_f") return *chainLength(c) - 1;
    const size_t digits = head.find_first_of("0123456789");
    TORCH_CHECK(digits != std::string::npos, "pipeline: parameter ", name, " names no layer");
    return std::stoi(head.substr(digits));
  }

  CommStats predictComm(const CaseSpec& c, int rank) const override {
    const Plan p = plan(c);
    const int me = rank / p.dp;
    const auto bytesOf = [&](int) {
      // Every stage boundary carries [rows, ...] of the input's shape (both chains keep it).
      const auto s = c.shape;
      const int64_t es = static_cast<int64_t>(c10::elementSize(c.dtype));
      const int64_t total = s.is_object() ? s.value("microbatches", int64_t{1}) : 1;
      if (c.workload == "mlp_chain") {
        return s.value("batch", int64_t{16}) / total * s.value("width", int64_t{64}) * es;
      }
      return s.value("batch", int64_t{2}) / total * s.value("seq", int64_t{64}) *
             s.value("d_model", int64_t{64}) * es;
    };
    CommStats one;
    CommStats& out = one;
    for (const Action& a : p.schedule.perRank[me]) {
      const int S = p.schedule.stages;
      const bool fwd = a.op == Op::kForward,
                 bwd = a.op == Op::kBackward || a.op == Op::kBackwardInput;
      if (fwd && a.stage > 0 && p.schedule.stageRank[a.stage - 1] != me) {
        out.add(Collective::kSendRecv, 0);  // receive
      }
      if (fwd && a.stage < S - 1 && p.schedule.stageRank[a.stage + 1] != me) {
        out.add(Collective::kSendRecv, bytesOf(a.stage));
      }
      if (bwd && a.stage < S - 1 && p.schedule.stageRank[a.stage + 1] != me) {
        out.add(Collective::kSendRecv, 0);
      }
      if (bwd && a.stage > 0 && p.schedule.stageRank[a.stage - 1] != me) {
        out.add(Collective::kSendRecv, bytesOf(a.stage));
      }
    }
    if (p.dp > 1) {
      // Every owned parameter's gradient, all-reduced over the replicas.
      const auto net = reference::findChainWorkload(c.workload)->makeNet(c.shape, c.dtype, 0);
      for (const auto& [name, t] : net->parameters()) {
        const Box b = resultBoxOf("grad/" + name, c, rank, t.sizes());
        if (b.length.empty() || b.length[0] > 0) {
          out.add(Collective::kAllReduce, static_cast<int64_t>(t.nbytes()));
        }
      }
    }
    if (!c.training.enabled()) return one;
    // Each step: the above; the loss and the norm's squares, each one float64 over the mesh.
    one.add(Collective::kAllReduce, 8);
    one.add(Collective::kAllReduce, 8);
    CommStats all = one;
    for (auto& e : all.entries) {
      e.calls *= c.training.steps;
      e.bytes *= c.training.steps;
    }
    return all;
  }

  harness::Tolerance tolerance(const std::string& tensor, const CaseSpec& c,
                               const at::Tensor& expected) const override {
    const Plan p = plan(c);
    harness::Tolerance t;
    if (p.dp == 1 && p.inOrder) {
      t = harness::Tolerance::bitwise(
          "the reference's micro-batches, accumulated in the schedule's order");
    } else {
      t = harness::splitReductionTolerance(harness::Tolerance::defaultFor(c.dtype), c.dtype,
                                           p.microbatches * p.dp, std::max(2, p.dp), expected);
      t.reason = std::string(p.dp > 1 ? "the replicas' sums added" : "micro-batches accumulated") +
                 " in another order than the reference's: " + t.reason;
    }
    if (!c.training.enabled()) return t;
    // Over steps: the gradient norm is a sum of squares split over the stages' ranks, so it is
    // not the reference's bits; where the norm clips, every update after depends on it.
    const auto splitNorm = [&] {
      harness::Tolerance n =
          harness::splitReductionTolerance(harness::Tolerance::defaultFor(c.dtype), c.dtype,
                                           int64_t{1} << 20, p.pp * p.dp, expected);
      n.reason = "the norm's squares summed per stage, then over the ranks: " + n.reason;
      return n;
    };
    if (tensor == "grad_norm")
      return harness::overSteps(splitNorm(), c.dtype, c.training.steps, expected);
    if (c.training.optimizer.clipGradNorm > 0 &&
        !(t.exact && tensor == "loss" && c.training.steps == 1)) {
      return harness::overSteps(t.exact ? splitNorm() : t, c.dtype, c.training.steps, expected);
    }
    return harness::overSteps(t, c.dtype, c.training.steps, expected);
  }

  // Memory: the dry run on each action's profiled bytes, claimed to the byte. Time: recorded
  // beside the measurement, not judged (ranks sharing cores on a CPU are not the pipeline's
  // devices).
  PredictionTolerance predictionTolerance() const override {
    return PredictionTolerance::exactMemory();
  }

  std::vector<std::string> plantableFaults() const override {
    if (kind_ == "1f1b") return {faultName(Fault::kGradTwice), faultName(Fault::kWarmupShort)};
    if (kind_ == "zb-h1") return {faultName(Fault::kWeightBeforeInput)};
    if (kind_ == "interleaved-1f1b") return {faultName(Fault::kSendWrongStage)};
    return {};
  }
  std::unique_ptr<harness::Strategy> withPlantedFault(const std::string& name) const override {
    for (Fault f : {Fault::kGradTwice, Fault::kWarmupShort, Fault::kWeightBeforeInput,
                    Fault::kSendWrongStage}) {
      const auto ok = plantableFaults();
      if (name == faultName(f) && std::find(ok.begin(), ok.end(), name) != ok.end()) {
        return std::make_unique<PipelineStrategy>(kind_, f);
      }
    }
    return nullptr;
  }

 private:
  // The schedule faults: a warm-up one forward short, a W before its I.
  void plant(Schedule& s) const {
    if (fault_ == Fault::kWarmupShort) {
      for (auto& actions : s.perRank) {
        // The first backward one place earlier (before the last warm-up forward).
        auto b = std::find_if(actions.begin(), actions.end(),
                              [](const Action& a) { return a.op == Op::kBackward; });
        if (b != actions.begin() && b != actions.end()) std::iter_swap(b - 1, b);
      }
    }
    if (fault_ == Fault::kWeightBeforeInput) {
      auto& actions = s.perRank.front();
      auto i = std::find_if(actions.begin(), actions.end(),
                            [](const Action& a) { return a.op == Op::kBackwardInput; });
      auto w = std::find_if(actions.begin(), actions.end(), [&](const Action& a) {
        return a.op == Op::kBackwardWeight && a.microbatch == i->microbatch;
      });
      const Action moved = *w;
      actions.erase(w);
      actions.insert(i, moved);
    }
  }

  std::string kind_;
  Fault fault_;
  mutable std::mutex mu_;
  mutable std::map<std::string, Plan> plans_;
};

PipelineExecutor::PipelineExecutor(const PipelineStrategy& s, const CaseSpec& c)
    : case_(c), fault_(s.fault()), plan_(s.plan(c)), training_(c.training.enabled()) {}

at::Tensor PipelineExecutor::stageForward(int stage, const at::Tensor& x) const {
  at::Tensor h = x;
  for (int l = plan_.cut[stage]; l < plan_.cut[stage + 1]; ++l) h = net_->stage(l, h, true);
  return h;
}

void PipelineExecutor::prepare(RankContext& ctx, const reference::WorkloadData&) {
  // NCCL matches a pair's sends and receives by their order, not their tags: a schedule that
  // mixes activations and gradients in one direction would take one for the other.
  if (ctx.world().backendName() == "nccl") {
    throw harness::UnsupportedCase(
        "the pipeline's sends are matched by tag; NCCL matches them by order (not run there yet)");
  }
  p_ = ctx.group({0}).rank();
  d_ = plan_.dp > 1 ? ctx.group({1}).rank() : 0;
  if (plan_.dp > 1) dpComm_ = &ctx.group({1});
  worldComm_ = &ctx.world();
  net_ =
      reference::findChainWorkload(case_.workload)->makeNet(case_.shape, case_.dtype, case_.seed);
  const int64_t rows = net_->input().size(0) / plan_.dp;
  const at::Tensor in = net_->input().narrow(0, d_ * rows, rows);
  const at::Tensor tgt = net_->target().narrow(0, d_ * rows, rows);
  for (const at::Tensor& t : in.chunk(plan_.microbatches, 0)) inputs_.push_back(t.contiguous());
  for (const at::Tensor& t : tgt.chunk(plan_.microbatches, 0)) targets_.push_back(t.contiguous());
  for (const auto& [name, t] : net_->parameters()) {
    const int layer = PipelineStrategy::layerOf(case_, name);
    const int stage = static_cast<int>(std::upper_bound(plan_.cut.begin(), plan_.cut.end(), layer) -
                                       plan_.cut.begin() - 1);
    shapes_[name] = t.sizes().vec();
    if (plan_.schedule.stageRank[stage] != p_) {
      // Another rank's stage: its parameters are let go (the layers hold the tensors, emptied),
      // so that a rank's memory is its stages' alone.
      at::NoGradGuard noGrad;
      at::Tensor(t).set_(at::empty({0}, t.options()));
      continue;
    }
    owned_.emplace_back(name, t);
    stageParams_[stage].push_back(t);
    t.mutable_grad() = at::zeros_like(t);
  }
  profile(ctx);
  if (training_) {
    for (const auto& [name, t] : owned_) initial_.push_back(t.detach().clone());
    const std::vector<bool> counted(owned_.size(), d_ == 0);
    update_ = harness::profileUpdate(ctx.rank(), case_.training, owned_, counted);
  }
}

// Each of this rank's stages timed on micro-batch 0 (forward; backward, or its input and weight
// halves), the median of three; every stage's gathered; the dry run on them.
void PipelineExecutor::profile(RankContext& ctx) {
  const int S = plan_.schedule.stages;
  const auto us = [](auto t0) {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  };
  at::Tensor mine = at::zeros({S, 4}, at::kDouble);
  for (const auto& [stage, params] : stageParams_) {
    std::vector<double> f, b, i, w;
    for (int rep = 0; rep < 3; ++rep) {
      // Both chains keep the input's shape from layer to layer.
      at::Tensor x = inputs_[0].detach().clone().requires_grad_(true);
      auto t0 = std::chrono::steady_clock::now();
      at::Tensor y = stageForward(stage, x);
      f.push_back(us(t0));
      const at::Tensor g = at::ones_like(y);
      t0 = std::chrono::steady_clock::now();
      torch::autograd::grad({y}, {x}, {g}, /*retain_graph=*/true);
      i.push_back(us(t0));
      t0 = std::chrono::steady_clock::now();
      torch::autograd::grad({y}, params, {g}, /*retain_graph=*/true);
      w.push_back(us(t0));
      std::vector<at::Tensor> all = params;
      all.push_back(x);
      t0 = std::chrono::steady_clock::now();
      torch::autograd::grad({y}, all, {g});
      b.push_back(us(t0));
    }
    const auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    mine[stage][0] = median(f);
    mine[stage][1] = median(b);
    mine[stage][2] = median(i);
    mine[stage][3] = median(w);
  }
  // Each stage's row is nonzero on its rank only: summed over the pipeline, every stage's.
  at::Tensor all = mine.clone();
  ctx.group({0}).allReduce(all);
  Costs costs;
  // One hop of an activation between neighbours: half a ping-pong's round trip, timed on one
  // clock (ranks 2k and 2k + 1), the median of five after one to warm up; the pairs' mean.
  auto& pipe = ctx.group({0});
  const bool pinger = p_ % 2 == 0 && p_ + 1 < plan_.pp, ponger = p_ % 2 == 1;
  const int kPing = tagOf(plan_, S, 0, 0), kPong = kPing + 1;  // past every action's tag
  at::Tensor ball = at::empty_like(inputs_[0]);
  std::vector<double> hops;
  for (int rep = 0; rep < 6 && (pinger || ponger); ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    if (pinger) {
      auto sent = pipe.isend(inputs_[0], p_ + 1, kPing);
      pipe.recv(ball, p_ + 1, kPong);
      sent->wait();
      if (rep > 0) hops.push_back(us(t0) / 2);
    } else {
      pipe.recv(ball, p_ - 1, kPing);
      pipe.isend(ball, p_ - 1, kPong)->wait();
    }
  }
  std::sort(hops.begin(), hops.end());
  at::Tensor hop = at::tensor(
      {hops.empty() ? 0.0 : hops[hops.size() / 2], hops.empty() ? 0.0 : 1.0}, at::kDouble);
  pipe.allReduce(hop);
  costs.p2pUs = hop[0].item<double>() / std::max(1.0, hop[1].item<double>());
  for (int s = 0; s < S; ++s) {
    StageCost c;
    c.forwardUs = all[s][0].item<double>();
    c.backwardUs = all[s][1].item<double>();
    c.backwardInputUs = all[s][2].item<double>();
    c.backwardWeightUs = all[s][3].item<double>();
    costs.stages.push_back(c);
  }
  profileMemory(ctx, costs);
  costs_ = costs;
  predicted_ = simulate(plan_.schedule, costs);
  if (predicted_.deadlock.empty()) predictedStepUs_ = predicted_.stepUs;
}

void PipelineExecutor::profileMemory(RankContext& ctx, Costs& costs) {
  auto& mem = harness::MemoryTracker::instance();
  const int r = ctx.rank(), S = plan_.schedule.stages;
  outputs_.assign(plan_.microbatches, at::Tensor());
  gradInputs_.assign(plan_.microbatches, at::Tensor());
  // Each stage's row is this rank's where it holds the stage; summed over the pipeline below.
  at::Tensor mine = at::zeros({S, 8}, at::kDouble);
  const int64_t start = mem.current(r);
  profiling_ = true;
  const auto measure = [&](int stage, Op op, int m = 0) {
    StageCost::Bytes b;
    const int64_t before = mem.current(r);
    b.peak = static_cast<double>(mem.heldDuring(r, [&] { run(ctx, {stage, op, m}); }));
    b.net = static_cast<double>(mem.current(r) - before);
    return b;
  };
  // Every kind of backward the rank's actions use on the stage (a CSV may mix B with I and W).
  std::set<std::pair<int, Op>> used;
  for (const Action& a : plan_.schedule.perRank[p_]) used.insert({a.stage, a.op});
  for (int s = 0; s < S; ++s) {
    if (plan_.schedule.stageRank[s] != p_) continue;
    const StageCost::Bytes f = measure(s, Op::kForward);
    mine[s][0] = f.net;
    mine[s][1] = f.peak;
    bool forwarded = true;
    if (used.count({s, Op::kBackward})) {
      const StageCost::Bytes b = measure(s, Op::kBackward);
      mine[s][2] = b.net;
      mine[s][3] = b.peak;
      forwarded = false;
    }
    if (used.count({s, Op::kBackwardInput})) {
      // Where B was measured on micro-batch 0, I and W on micro-batch 1 (a schedule mixing
      // them has two or more): micro-batch 0's kept output is not let go in between.
      const int m = forwarded ? 0 : 1;
      if (!forwarded) measure(s, Op::kForward, m);
      const StageCost::Bytes i = measure(s, Op::kBackwardInput, m);
      const StageCost::Bytes w = measure(s, Op::kBackwardWeight, m);
      mine[s][4] = i.net;
      mine[s][5] = i.peak;
      mine[s][6] = w.net;
      mine[s][7] = w.peak;
    }
  }
  profiling_ = false;
  held_.clear();
  stash_.clear();
  outputs_.clear();
  gradInputs_.clear();
  TORCH_CHECK(mem.current(r) == start, "pipeline: the memory profile left ", mem.current(r) - start,
              " bytes allocated");
  ctx.group({0}).allReduce(mine);
  for (int s = 0; s < S; ++s) {
    StageCost& c = costs.stages.at(static_cast<size_t>(s));
    c.forwardBytes = {mine[s][0].item<double>(), mine[s][1].item<double>()};
    c.backwardBytes = {mine[s][2].item<double>(), mine[s][3].item<double>()};
    c.backwardInputBytes = {mine[s][4].item<double>(), mine[s][5].item<double>()};
    c.backwardWeightBytes = {mine[s][6].item<double>(), mine[s][7].item<double>()};
  }
}

// The dry run's peak for this rank (its actions' profiled bytes in its order) above what was
// live once the step let the last step's outputs go; then, after the step waits for its sends
// and lets what they held go, data parallelism's all-reduce of each gradient (its scratch).
std::optional<int64_t> PipelineExecutor::predictedPeakBytes() const {
  // On a GPU, the split backward's autograd::grad runs on LibTorch's device threads, whose
  // allocations count against no rank: no claim there.
  if (!predicted_.deadlock.empty() || reference::caseDevice().is_cuda()) return std::nullopt;
  const int S = plan_.schedule.stages;
  double net = 0;
  int64_t sent = 0;
  for (const Action& a : plan_.schedule.perRank[p_]) {
    const StageCost& c = costs_.of(a.stage);
    switch (a.op) {
      case Op::kForward:
        net += c.forwardBytes.net;
        if (a.stage < S - 1) ++sent;
        break;
      case Op::kBackward:
        net += c.backwardBytes.net;
        if (a.stage > 0) ++sent;
        break;
      case Op::kBackwardInput:
        net += c.backwardInputBytes.net;
        if (a.stage > 0) ++sent;
        break;
      case Op::kBackwardWeight:
        net += c.backwardWeightBytes.net;
        break;
    }
  }
  const auto scratchOf = [](harness::Communicator* comm, int64_t bytes, at::ScalarType t) {
    return comm && comm->size() > 1 ? comm->scratchBytes(Collective::kAllReduce, bytes, bytes, t)
                                    : int64_t{0};
  };
  int64_t dpScratch = 0;
  if (plan_.dp > 1) {
    for (const auto& [name, t] : owned_) {
      dpScratch = std::max(dpScratch,
                           scratchOf(dpComm_, static_cast<int64_t>(t.nbytes()), t.scalar_type()));
    }
  }
  // Each iteration (one, or the case's steps) from what was live once it let the last one's
  // outputs go (and, after the first update, the optimizer's state): its actions' walk; after
  // its sends are let go, data parallelism's all-reduce; training's loss (one float64,
  // all-reduced) and the update (measured: the most above what was live before the first).
  int64_t peak = entryBefore_;
  const int iterations = training_ ? case_.training.steps : 1;
  for (int k = 0; k < iterations; ++k) {
    const int64_t state = k > 0 ? update_.stateBytes : 0;
    const int64_t base = entryAfter_ + state;
    const int64_t end =
        base + static_cast<int64_t>(net) - sent * static_cast<int64_t>(inputs_.at(0).nbytes());
    peak = std::max(
        {peak, base + static_cast<int64_t>(predicted_.ranks.at(p_).peakBytes), end + dpScratch});
    if (training_) {
      peak = std::max(
          {peak, end + 8 + scratchOf(worldComm_, 8, at::kDouble), end - state + update_.peak});
    }
  }
  return peak;
}

void PipelineExecutor::run(RankContext& ctx, const Action& a) {
  auto& pipe = ctx.group({0});
  const int S = plan_.schedule.stages, s = a.stage, m = a.microbatch;
  const auto& where = plan_.schedule.stageRank;
  const auto receive = [&](const at::Tensor& like, int from, int tag, const char* what) {
    at::Tensor t = at::empty_like(like, at::MemoryFormat::Contiguous);
    if (profiling_) return t;
    try {
      pipe.recv(t, from, tag);
    } catch (const c10::Error& e) {
      TORCH_CHECK(false, "pipeline rank ", p_, " at ", a.name(), " waiting for ", what, ": ",
                  e.what_without_backtrace());
    }
    computeStart_ = std::chrono::steady_clock::now();  // the wait before it is idle time
    return t;
  };
  const auto send = [&](const at::Tensor& t, int to, int tag) {
    if (profiling_) {
      held_.push_back(t);
    } else {
      sends_.push_back(pipe.isend(t, to, tag));
    }
  };
  if (a.op == Op::kForward) {
    at::Tensor x = s == 0 ? inputs_[m]
                          : receive(inputs_[m], where[s - 1], tagOf(plan_, s, m, 0),
                                    "the previous stage's activation");
    x = x.detach().requires_grad_(true);
    at::Tensor y = stageForward(s, x);
    if (s < S - 1) {
      int to = s + 1;
      if (fault_ == Fault::kSendWrongStage && s == 0 && m == 0) to = std::min(S - 1, s + 2);
      send(y.detach(), where[s + 1], tagOf(plan_, to, m, 0));
    }
    stash_[{s, m}] = {x, y, at::Tensor()};
    return;
  }
  auto it = stash_.find({s, m});
  TORCH_CHECK(it != stash_.end(), "pipeline rank ", p_, " runs ", a.name(), " before ",
              std::to_string(s) + "F" + std::to_string(m), " (its forward)");
  Stash& st = it->second;
  if (a.op == Op::kBackwardWeight) {
    TORCH_CHECK(st.gy.defined(), "pipeline rank ", p_, " runs ", a.name(), " before ",
                std::to_string(s) + "I" + std::to_string(m),
                ": the weight gradient needs the output's gradient, which the input gradient's "
                "pass receives");
    const auto& params = stageParams_.at(s);
    const auto grads = torch::autograd::grad({st.y}, params, {st.gy});
    for (size_t k = 0; k < params.size(); ++k) params[k].mutable_grad().add_(grads[k]);
    stash_.erase(it);
    return;
  }
  if (training_ && s == S - 1) lossSum_ += (st.y * targets_[m]).sum().item<double>();
  const at::Tensor gy = s == S - 1 ? targets_[m]
                                   : receive(st.y, where[s + 1], tagOf(plan_, s, m, 1),
                                             "the next stage's input gradient");
  at::Tensor gx;
  if (a.op == Op::kBackward) {
    // Planted: this micro-batch's share of every parameter's gradient added a second time.
    const bool twice = fault_ == Fault::kGradTwice && s == 0 && m == 1;
    std::vector<at::Tensor> before;
    if (twice) {
      for (const at::Tensor& p : stageParams_.at(s)) before.push_back(p.grad().clone());
    }
    reference::backward({st.y}, {gy});
    for (size_t k = 0; k < before.size(); ++k) {
      const at::Tensor& g = stageParams_.at(s)[k].mutable_grad();
      g.add_(g - before[k]);
    }
    gx = st.x.grad();
  } else {
    gx = torch::autograd::grad({st.y}, {st.x}, {gy}, /*retain_graph=*/true)[0];
    st.gy = gy;
  }
  if (s > 0) {
    send(gx, where[s - 1], tagOf(plan_, s - 1, m, 1));
  } else {
    gradInputs_[m] = gx;
  }
  if (s == S - 1) outputs_[m] = st.y.detach();
  if (a.op == Op::kBackward) stash_.erase(it);
}

void PipelineExecutor::step(RankContext& ctx) {
  auto& mem = harness::MemoryTracker::instance();
  entryBefore_ = mem.current(ctx.rank());
  at::manual_seed(reference::ChainWorkload::dropoutSeed(case_.seed));
  const int iterations = training_ ? case_.training.steps : 1;
  if (training_) {
    // Every step() is the case's whole run: from the initial parameters, a new optimizer (the
    // last run's state let go), the norm's squares each counted on one replica, summed over
    // the mesh.
    loop_.reset();
    at::NoGradGuard noGrad;
    for (size_t i = 0; i < owned_.size(); ++i) owned_[i].second.copy_(initial_[i]);
    loop_ = std::make_unique<reference::TrainingLoop>(case_.training, owned_);
    harness::shareNormOver(*loop_, std::vector<bool>(owned_.size(), d_ == 0), ctx.world());
  }
  const auto now = [&] {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start_)
        .count();
  };
  double end = 0;
  for (int k = 0; k < iterations; ++k) {
    for (auto& [name, t] : owned_) t.mutable_grad().zero_();
    outputs_.assign(plan_.microbatches, at::Tensor());
    gradInputs_.assign(plan_.microbatches, at::Tensor());
    if (k == 0) entryAfter_ = mem.current(ctx.rank());
    lossSum_ = 0;
    timeline_.clear();
    start_ = std::chrono::steady_clock::now();
    for (const Action& a : plan_.schedule.perRank[p_]) {
      computeStart_ = std::chrono::steady_clock::now();
      try {
        run(ctx, a);
      } catch (const c10::Error& e) {
        // A schedule that cannot finish: what the dry run said of it, beside what happened.
        TORCH_CHECK(predicted_.deadlock.empty(), e.what_without_backtrace(),
                    " (the dry run: " + predicted_.deadlock + ")");
        throw;
      }
      const double t0 = std::chrono::duration<double, std::micro>(computeStart_ - start_).count();
      timeline_.push_back({a, t0, now()});
    }
    for (auto& s : sends_) s->wait();
    sends_.clear();
    end = now();
    if (plan_.dp > 1) {
      for (auto& [name, t] : owned_) ctx.group({1}).allReduce(t.mutable_grad());
    }
    if (training_) {
      // The loss: the last stage's micro-batches', summed over the replicas (every other rank
      // adds nothing); then the loop's norm (over the mesh), clipping and update.
      double loss = 0;
      {
        at::Tensor l = at::tensor({lossSum_}, at::kDouble);
        ctx.world().allReduce(l);
        loss = l.item<double>();
      }
      loop_->update(loss);
    }
  }
  // The measured timeline, for the record (the last iteration's; details() reads it after the
  // measured step).
  double busy = 0;
  for (const auto& t : timeline_) busy += t.endUs - t.startUs;
  details_["pipeline"]["rank_busy_us"] = busy;
  details_["pipeline"]["rank_step_us"] = end;
}

void PipelineExecutor::settle(RankContext& ctx) {
  results_.clear();
  const auto shapeOf = [](const at::Tensor& t) { return t.sizes().vec(); };
  const auto empty = [&](std::vector<int64_t> shape) {
    shape[0] = 0;
    return at::empty(shape, net_->input().options());
  };
  const int S = plan_.schedule.stages;
  std::vector<int64_t> outShape = shapeOf(net_->target());
  outShape[0] /= plan_.dp;
  results_["output"] =
      plan_.schedule.stageRank[S - 1] == p_ ? at::cat(outputs_, 0) : empty(shapeOf(net_->target()));
  results_["grad_input"] =
      plan_.schedule.stageRank[0] == p_ ? at::cat(gradInputs_, 0) : empty(shapeOf(net_->input()));
  std::set<std::string> mine;
  for (const auto& [name, t] : owned_) {
    results_["grad/" + name] = t.grad();
    mine.insert(name);
  }
  for (const auto& [name, shape] : shapes_) {
    if (!mine.count(name)) results_["grad/" + name] = empty(shape);
  }
  results_["rng/cpu"] = at::detail::getDefaultCPUGenerator().get_state();
  if (net_->input().is_cuda()) {
    results_["rng/cuda"] = reference::deviceGeneratorState(net_->input().device());
  }
  if (training_) {
    // loss, grad_norm, this rank's param/ and state/, state/step; nothing of the others'.
    loop_->write(results_);
    for (const auto& [name, shape] : shapes_) {
      if (mine.count(name)) continue;
      results_["param/" + name] = empty(shape);
      for (const std::string& key : reference::optimizerStateKeys(case_.training.optimizer)) {
        results_["state/" + name + "/" + key] = empty(shape);
      }
    }
  }
  // Every rank's measured busy and step time, gathered (uncounted: settle), beside the dry run.
  at::Tensor mineT = at::tensor({details_["pipeline"]["rank_busy_us"].get<double>(),
                                 details_["pipeline"]["rank_step_us"].get<double>()},
                                at::kDouble);
  const at::Tensor all =
      ctx.group({0}).allGather(mineT.view({1, 2}), std::vector<int64_t>(plan_.pp, 1));
  double step = 0, idle = 0;
  std::vector<double> idlePerRank;
  for (int r = 0; r < plan_.pp; ++r) step = std::max(step, all[r][1].item<double>());
  for (int r = 0; r < plan_.pp; ++r) {
    idlePerRank.push_back(step - all[r][0].item<double>());
    idle += idlePerRank.back();
  }
  std::vector<double> predictedIdle;
  for (const auto& rt : predicted_.ranks) predictedIdle.push_back(predicted_.stepUs - rt.busyUs);
  auto& d = details_["pipeline"];
  d["schedule"] = plan_.schedule.name;
  d["stages"] = S;
  d["microbatches"] = plan_.microbatches;
  d["stage_layers"] = plan_.cut;
  d["measured"] = {{"step_us", step},
                   {"idle_us_per_rank", idlePerRank},
                   {"bubble_fraction", step > 0 ? idle / (plan_.pp * step) : 0.0}};
  d["predicted"] = {{"step_us", predicted_.stepUs},
                    {"idle_us_per_rank", predictedIdle},
                    {"bubble_fraction", predicted_.bubbleFraction}};
  if (!predicted_.deadlock.empty()) d["predicted"]["deadlock"] = predicted_.deadlock;
  // The costs the dry run ran on, in `solve pipeline --profile`'s format.
  nlohmann::json stages = nlohmann::json::array();
  for (const StageCost& c : costs_.stages) {
    nlohmann::json e = {{"forward_us", c.forwardUs},
                        {"backward_us", c.backwardUs},
                        {"backward_input_us", c.backwardInputUs},
                        {"backward_weight_us", c.backwardWeightUs}};
    for (const auto& [kind, b] :
         {std::pair<const char*, StageCost::Bytes>{"forward", c.forwardBytes},
          {"backward", c.backwardBytes},
          {"backward_input", c.backwardInputBytes},
          {"backward_weight", c.backwardWeightBytes}}) {
      e[std::string(kind) + "_net_bytes"] = b.net;
      e[std::string(kind) + "_peak_bytes"] = b.peak;
    }
    stages.push_back(e);
  }
  d["profile"] = {{"p2p_us", costs_.p2pUs}, {"stages", stages}};
  d.erase("rank_busy_us");
  d.erase("rank_step_us");
  (void)outShape;
}

std::vector<std::pair<std::string, std::string>> PipelineExecutor::recordParams() const {
  return {{"schedule", plan_.schedule.name},
          {"stages", std::to_string(plan_.schedule.stages)},
          {"microbatches", std::to_string(plan_.microbatches)},
          {"data_parallel", std::to_string(plan_.dp)}};
}

std::vector<std::unique_ptr<harness::Strategy>> registerPipeline() {
  std::vector<std::unique_ptr<harness::Strategy>> out;
  for (const std::string& k : scheduleKinds()) {
    out.push_back(std::make_unique<PipelineStrategy>(k, Fault::kNone));
  }
  out.push_back(std::make_unique<PipelineStrategy>("csv", Fault::kNone));
  return out;
}

}  // namespace
}  // namespace sb::strategies::pipeline

SB_REGISTER_STRATEGIES(sb::strategies::pipeline::registerPipeline);
