#pragma once

#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "harness/box.h"
#include "harness/case.h"
#include "harness/comm/comm.h"
#include "harness/comm/rank_context.h"
#include "harness/dist/cost_profile.h"
#include "harness/error.h"
#include "harness/measure/verify.h"
#include "harness/trace_value.h"
#include "reference/workload.h"

namespace sb::harness {

// What a row's `family` column says and `list --family` picks: tensor sharding on a mesh
// (operator strategies, Linear, ShardedTensor, Megatron blocks, auto-sharding, redistribution,
// DTensor TP/SP), then the families with pages of their own. New values go at the end: a
// plugin built against an earlier header keeps its numbers.
enum class Family {
  kSharding,
  kChunking,
  kCheckpointing,
  kFsdp,             // "fsdp": DDP, ZeRO-1/2/3, FSDP, HSDP (docs/fsdp.md)
  kPipeline,         // "pipeline": pipeline schedules (docs/pipeline.md)
  kContextParallel,  // "cp": context parallelism (docs/context-parallel.md)
  kExpertParallel,   // "moe": expert parallelism of mixture-of-experts layers (docs/moe.md)
  kComposed,         // "compose": several families on one N-D mesh (docs/compose.md)
};
const char* familyName(Family f);  // "sharding", "fsdp", ...
// Every family's name, in the enum's order.
const std::vector<std::string>& familyNames();

// Whether a strategy can run a case.
struct Applicability {
  enum class Kind {
    kApplies,
    kNotApplicable,  // another workload or mesh kind: the strategy is not selected at all
    kUnsupported,    // the right kind of case, but this shape cannot be run: an `unsupported` row
  };
  Kind kind = Kind::kApplies;
  std::string reason;

  static Applicability yes() { return {}; }
  static Applicability notApplicable(std::string why) {
    return {Kind::kNotApplicable, std::move(why)};
  }
  static Applicability unsupported(std::string why) { return {Kind::kUnsupported, std::move(why)}; }
};

class OutOfProcessStep;

// One rank's instance of a strategy for one case. Every rank runs the same code (SPMD).
class RankExecutor {
 public:
  virtual ~RankExecutor() = default;
  // Untimed: takes this rank's shards of the full inputs and parameters, allocates buffers.
  virtual void prepare(RankContext& ctx, const reference::WorkloadData& data) = 0;
  // Timed: one forward and backward on the prepared shards. Must leave no state that changes
  // the next step's results (gradients are recomputed, not accumulated).
  virtual void step(RankContext& ctx) = 0;
  // Untimed, and after the step's communication was counted: brings the last step's results
  // into the layout resultBox() declares, where the step leaves them otherwise (pending sums of
  // a partial layout are reduced over their group). Called before every results() that is
  // verified; the default does nothing.
  virtual void settle(RankContext& ctx) {}
  // This rank's local tensors from the last step, named as in WorkloadData::expected.
  virtual std::map<std::string, at::Tensor> results() const = 0;

  // After a measured step: this rank's predicted peak bytes where the prediction needs what
  // prepare() learnt (a profile, a plan); otherwise Strategy::predictPeakMemory is used.
  virtual std::optional<int64_t> predictedPeakBytes() const { return std::nullopt; }
  // Predicted step time in microseconds, from the strategy's cost model.
  virtual std::optional<double> predictedTimeUs() const { return std::nullopt; }
  // After prepare: the bytes this rank's measured peak must stay within, where the strategy
  // promises one (a checkpoint schedule's budget, a plan's memory limit), in the tracker's
  // terms (harness/memory.h: everything live, not only activations). A measured peak over it
  // fails the row, however right its numbers are.
  virtual std::optional<int64_t> memoryLimitBytes() const { return std::nullopt; }
  // Family-specific numbers for the record's `params` column (budget, recomputed forwards,
  // chunk size, ...) and details for its JSON (a schedule, a plan).
  virtual std::vector<std::pair<std::string, std::string>> recordParams() const { return {}; }
  virtual nlohmann::json details() const { return nlohmann::json::object(); }
  // Whether details() after the timed steps' settle() is the record's (measurements the
  // executor aggregates over every step it ran, the timed ones included, as the pipeline's
  // bubble); otherwise the record's details are those after the measured step.
  virtual bool detailsCoverTiming() const { return false; }

  // Locating a failure (harness/run/divergence.h): whether this executor can keep its pieces of
  // the step's intermediate values (Strategy::referenceTrace names them). Untimed, only on a
  // failing row or with `run --capture`: setCapture(true), one step(), captured() (this rank's
  // pieces, pending sums reduced, in any order), setCapture(false). A capture may communicate
  // (reducing pending sums), alike on every rank.
  virtual bool capturesValues() const { return false; }
  virtual void setCapture(bool on) {}
  virtual std::vector<TraceValue> captured() const { return {}; }

  // A step that runs in another process (a PyTorch rank, strategies/torch/), which this
  // process's allocation tracker and communicator never see: the facet through which the runner
  // has that process measure its measured step instead (OutOfProcessStep, below). nullptr: the
  // step runs here and is measured here (the default).
  virtual OutOfProcessStep* outOfProcess() { return nullptr; }
};

// What a step run in another process measured of itself: the rank's peak tensor bytes (what
// was live at the step's start included) and its collectives, counted where they ran.
struct OutOfProcessMeasures {
  int64_t peakBytes = 0;
  int64_t startBytes = 0;  // what was live when the step began
  CommStats comm;
};

// The facet of a RankExecutor whose step runs in another process (RankExecutor::outOfProcess).
class OutOfProcessStep {
 public:
  virtual ~OutOfProcessStep() = default;
  // The next step() is the measured one: count its collectives and profile its allocations
  // (the others run unobserved, as timed steps must).
  virtual void measureNextStep() = 0;
  // What the last measured step measured.
  virtual OutOfProcessMeasures measures() const = 0;
};

// A registered strategy: what it is, where it applies, how it lays out its results, what
// communication it predicts, and a factory for its per-rank executors.
class Strategy {
 public:
  Strategy(std::string id, std::string displayName, Family family)
      : id_(std::move(id)), displayName_(std::move(displayName)), family_(family) {}
  virtual ~Strategy() = default;

  const std::string& id() const { return id_; }
  const std::string& displayName() const { return displayName_; }
  Family family() const { return family_; }

  // Parameters as shown by `stratbench list` (e.g. mesh_axes, placements).
  virtual std::vector<std::pair<std::string, std::string>> params() const { return {}; }
  // The keys of a case's `params` (and `sweep`) this strategy reads, e.g. {"budget"}. A key
  // that none of a case's strategies reads is a mistake in the suite (a misspelt `budgt` would
  // otherwise run with no budget and pass), and `run` refuses it with exit 2.
  virtual std::vector<std::string> caseParams() const { return {}; }
  // Family-specific listing details; for sharding, the sharding sequence of every operand
  // for the workload's canonical shape and the communication in forward and backward.
  virtual nlohmann::json describe() const { return nlohmann::json::object(); }

  // Throws InputError (harness/error.h) naming `params.KEY` where a key it reads (caseParams)
  // holds a malformed value: a wrong type, a value out of range, a file that cannot be read.
  // Called before applies() (applicabilityOf): a malformed value is bad input wherever the case
  // is of the strategy's kind, even where it cannot run it, or a pattern that selects it would
  // hide the mistake behind `unsupported` rows and exit 0. Where applies() says the case is
  // not of its kind (notApplicable) the error is dropped: another strategy may read the key.
  virtual void checkParams(const CaseSpec& c) const {}
  // Whether it runs `c`, its params already checked (checkParams).
  virtual Applicability applies(const CaseSpec& c) const = 0;
  virtual std::unique_ptr<RankExecutor> makeExecutor(const CaseSpec& c) const = 0;
  // Whether its executors run a case's `steps` (reference/training.h): N optimizer steps from
  // the initial parameters in every step(), with the results training's expected tensors
  // name (loss, grad_norm, param/..., state/...). A strategy that does not is `unsupported`
  // on a case with steps (applicabilityOf), saying so.
  virtual bool trainsSteps() const { return false; }

  // The box of `tensor` that `rank` holds after a step, by the strategy's declared layout
  // (never by asking the executor, so a misplaced shard shows up as a mismatch).
  virtual Box resultBox(const std::string& tensor, const CaseSpec& c, int rank) const = 0;
  // The same, given the full tensor's shape: for strategies whose result shapes are known
  // only from the reference (a whole network's gradients). Defaults to resultBox().
  virtual Box resultBoxOf(const std::string& tensor, const CaseSpec& c, int rank,
                          at::IntArrayRef fullShape) const {
    return resultBox(tensor, c, rank);
  }
  // The box of `tensor` (full shape `fullShape`) that the specification this strategy claims
  // to implement gives `rank` (its ColossalAI sharding sequence, its ShardedTensor
  // ChunkShardingSpec and placements), with that specification's text for messages. An
  // override derives it from the specification as written, the strategy's name, by code that
  // shares nothing with its executor's layout code (strategies/sharding/layout/spec_boxes.h):
  // the runner fails a row whose declared resultBoxOf() differs from it, which catches a layout
  // that is wrong and computed consistently with itself, so that every tensor check passes.
  // nullopt: the strategy states no specification for this tensor (the default).
  struct SpecifiedBox {
    Box box;
    std::string spec;  // "ColossalAI `S0S1 = S0R x RS1_0` (grad_weight: the weight's [S1, R])"
  };
  virtual std::optional<SpecifiedBox> specifiedBox(const std::string& tensor, const CaseSpec& c,
                                                   int rank, at::IntArrayRef fullShape) const {
    return std::nullopt;
  }
  // Per-rank calls and bytes of one step, for comparison with what the backend counted.
  virtual CommStats predictComm(const CaseSpec& c, int rank) const = 0;
  // Whether predictComm() is this strategy's model of its own communication, judged (a row
  // whose counts differ from it fails), or only a comparison: a PyTorch strategy's counts beside
  // what stratbench's own executor of the same plan predicts (strategies/torch/), where a
  // difference is a finding for the record, not the row's failure. Judged by default.
  virtual bool judgesComm(const CaseSpec& c) const { return true; }
  // The same per node (graph node, module or operator) and phase of the step, as the executor
  // names them with CommSiteScope (harness/comm/comm_site.h), in the step's order; their sum is
  // predictComm(). The runner compares each node's with what the Communicator counted there, so
  // a collective issued at the wrong node fails the row even where the totals agree. nullopt:
  // no per-node model (the default; the record then shows the counted nodes beside the total).
  virtual std::optional<std::vector<NodeComm>> predictCommByNode(const CaseSpec& c,
                                                                 int rank) const {
    return std::nullopt;
  }
  // The same, per group of mesh axes, for the cost model (a calibration profile prices each
  // group apart). Defaults to all of it on the whole mesh.
  virtual std::vector<std::pair<std::vector<int>, CommStats>> predictCommByGroup(const CaseSpec& c,
                                                                                 int rank) const {
    std::vector<int> all(c.mesh.size());
    for (size_t a = 0; a < all.size(); ++a) all[a] = static_cast<int>(a);
    return {{all, predictComm(c, rank)}};
  }
  // Floating-point operations of this rank's matmuls in one step (forward and backward, three
  // matmuls), where the strategy models them. With a calibration profile for the case's
  // backend and mesh, the runner predicts the step time from this and the communication.
  virtual std::optional<double> predictFlops(const CaseSpec& c, int rank) const {
    return std::nullopt;
  }
  // Local data movement of this rank in one step (copies outside collectives and matmuls),
  // where the strategy models it; a calibration profile prices it by its copy fit.
  virtual std::optional<LocalWork> predictLocalWork(const CaseSpec& c, int rank) const {
    return std::nullopt;
  }
  // How far a measurement may be from this strategy's predictions before the row is flagged
  // `mispredicted` (Record::mispredicted): |measured - predicted| / measured, per prediction.
  // Memory: 5% unless a strategy states otherwise (the tracker counts every byte, so a model
  // is either right or has a known reason); time: no claim unless a strategy states one (on
  // a shared machine a step's time moves by more than any cost model's error). nullopt: the
  // prediction is shown and its error recorded, never judged.
  struct PredictionTolerance {
    std::optional<double> memory = 0.05;
    std::optional<double> time;
    // A model that replays every allocation of the step claims the peak to the byte: judged
    // with tolerance 0, so a model a few bytes off (a missed temporary) is flagged. No time
    // claim.
    static PredictionTolerance exactMemory() { return {0.0, std::nullopt}; }
  };
  virtual PredictionTolerance predictionTolerance() const { return {}; }
  // The claim for one case, where it depends on the case (a plan's replay is exact on the
  // operators it knows): predictionTolerance() unless a strategy says otherwise. The runner
  // judges a row by this one.
  virtual PredictionTolerance casePredictionTolerance(const CaseSpec& c) const {
    return predictionTolerance();
  }

  // Per-rank peak bytes of one step, where the strategy has a model of it.
  virtual std::optional<int64_t> predictPeakMemory(const CaseSpec& c, int rank) const {
    return std::nullopt;
  }
  // The dtype this strategy's forward and backward compute in where it is lower than the case's
  // (FSDP2's param_dtype: bfloat16 against a float32 reference); std::nullopt: the case's. The
  // runner then measures the reference's own rounding in that dtype too (the reference built in
  // it from the case's values, against float64) and raises the tolerances to it.
  virtual std::optional<at::ScalarType> arithmeticDtype(const CaseSpec& c) const {
    return std::nullopt;
  }
  // Whether this strategy draws the random numbers of a case whose model draws them (shape key
  // `random: true`, drawsRandomNumbers below: dropout in training) as the reference does: the
  // same draws in the same order from the same generator state, which only the module itself
  // run on the whole batch does (strategies/torch/'s one-rank executors). No by default: every
  // other strategy is `unsupported` on such a case, saying why (applicabilityOf).
  virtual bool repeatsDraws(const CaseSpec& c) const { return false; }
  // Tolerance for `tensor`, whose full reference value is `expected`; defaults to the dtype's
  // (bitwise in exact-inputs mode). An override must say why in Tolerance::reason. The runner
  // raises it to the reference's own rounding where that was measured (docs/results.md).
  virtual Tolerance tolerance(const std::string& tensor, const CaseSpec& c,
                              const at::Tensor& expected) const;
  // The reference run's intermediate values that the executors capture (RankExecutor::
  // capturesValues), whole and in the step's execution order: every node's forward outputs,
  // then the gradients in the order the backward completes them. Matched to the captured pieces
  // by TraceValue::key(); judged with tolerance() of the value's name. Empty: nothing to locate
  // with (the default).
  virtual std::vector<TraceValue> referenceTrace(const CaseSpec& c,
                                                 const reference::WorkloadData& data) const {
    return {};
  }
  // A strategy whose step is one node (one operator's sharding, a Linear, a redistribution, a
  // chunked operator) names it here: a failing row's first divergence is then that node, its
  // phase the earliest failing result's (the output: forward; a gradient: backward), read from
  // the row's own checks (divergence.h). Empty: not one node (the default).
  virtual std::string singleNode(const CaseSpec& c) const { return ""; }
  // Case-specific details for the record (e.g. sharding sequences at the case's shape).
  virtual nlohmann::json caseDetails(const CaseSpec& c) const { return nlohmann::json::object(); }

  // Deliberate bugs this strategy can be built with, by name (e.g. "skip_forward_all_reduce"),
  // and a copy of it with one of them under the same id. Test-only: `run --plant-fault` uses
  // them to prove, end to end, that a wrong executor fails and that a report gates on it.
  virtual std::vector<std::string> plantableFaults() const { return {}; }
  virtual std::unique_ptr<Strategy> withPlantedFault(const std::string& fault) const {
    return nullptr;
  }

 private:
  std::string id_;
  std::string displayName_;
  Family family_;
};

// Whether `s` runs `c`: applies(), and, for a case with steps, trainsSteps(). What every
// caller asks (the plan, the runners), so that a one-step strategy is never run on a training
// case and checked against tensors it does not produce.
Applicability applicabilityOf(const Strategy& s, const CaseSpec& c);
// Whether the case's model draws random numbers (its shape's `random: true`, which the
// torchscript workload takes for a model with dropout in training).
bool drawsRandomNumbers(const CaseSpec& c);

// A strategy that runs on one rank and hands back every tensor whole (checkpointing,
// chunking): its results are boxed by their full shape and it communicates nothing.
class SingleRankStrategy : public Strategy {
 public:
  using Strategy::Strategy;
  Box resultBox(const std::string&, const CaseSpec&, int) const override {
    TORCH_INTERNAL_ASSERT(false, "whole results are boxed by resultBoxOf");
  }
  Box resultBoxOf(const std::string&, const CaseSpec&, int,
                  at::IntArrayRef fullShape) const override {
    return Box::whole(fullShape);
  }
  CommStats predictComm(const CaseSpec&, int) const override { return {}; }
};

}  // namespace sb::harness
