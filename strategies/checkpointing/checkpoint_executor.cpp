// Activation checkpointing: run a network's chain of stages under a schedule that keeps some
// activations and recomputes the others, and check that training computes exactly what it
// computes without checkpointing.
//
// Why one file (about 900 lines): one unnamed namespace holds what the schedule runner and the
// executor share (Fault, RngSnapshot, the runner, the chain as one autograd node), and it is
// the family's one unit of autograd's custom functions (custom_function.h, heavy on 2 cores).
// Where it would be cut: RngSnapshot, ScheduleRunner, CheckpointedChain and executeSchedule into
// schedule_runner.{h,cpp} (about 330 lines), once Fault has a header of its own; the executor,
// the strategy and registration stay here.
//
// prepare() builds the network (the reference's parameters, from the seed; for an imported
// model, workload torchscript, its graph linearised by reference/torchscript/linearize.h over
// the module's parameters, with the module's grad_output as target), profiles its
// chain (profiler.h: sizes in bytes, times in microseconds) and asks the strategy's solver for
// a schedule under the case's budget: params.budget, a fraction of the peak of keeping every
// tape (none), or unconstrained when absent. No schedule fits: the row is `unsupported`.
//
// step() runs the schedule through a custom autograd function, CheckpointedChain: its forward
// runs the operations before the loss (CF_i and Fn_i without a tape, Fe_i with one), returns
// x[L], and leaves the held values in a ScheduleRunner; the loss sum(y * target) is plain
// autograd; its backward receives d[L] and runs the rest: recomputations and B_i, each a
// backward through one stage's tape from d[i+1] to d[i], parameters' gradients accumulating
// as they would in one backward. So the checkpointed chain is one node of an autograd graph
// and could sit inside a larger model.
//
// What makes the gradients bitwise equal to the plain run's:
//   - a recomputation repeats the stage's arithmetic on the same input values;
//   - dropout draws the same mask: before a stage's first forward the generator's state is
//     recorded; a recomputation runs from that state and restores the generator afterwards,
//     so later first forwards draw what they would have drawn. On a GPU that is the device's
//     generator too (Philox seed and offset), which dropout on its tensors draws from. The
//     recorded states are generator copies (RngSnapshot, 2.5 KiB of Mersenne Twister each,
//     16 bytes for a GPU's), host bookkeeping beside the tensors, as torch.utils.checkpoint
//     keeps its stashes in host memory beside a GPU's: neither the tracker nor the chain model
//     counts them. (get_state() would make each a 5 KiB tensor, a third of a small MLP stage's
//     activation, and the measured peak would then be the model's plus a term no checkpointing
//     model has.);
//   - batch norm's running statistics are updated by a stage's first forward only
//     (updateBuffers = false on recomputation; the batch statistics it normalises with are
//     the same either way).
// Planted faults (tests only): "no_rng_restore" recomputes with the generator as it is;
// "stale_input" makes a recomputed stage read the slot of the stage before it;
// "rng_left_after_recompute" recomputes with the right masks but leaves the generator where
// the recomputation left it: every number of the step is right, and only the generator state
// it hands to the next step (compared as "rng/cpu", and "rng/cuda" on a GPU) is wrong;
// "ignore_budget" solves without the budget (keeping every tape where that is fastest) and still
// promises it: right numbers, a measured peak over the promise; "keep_input_to_end" keeps every
// stage's input until the step ends (a leak: flagged after the backward that should have freed
// it, details.executor.held_after_operations); rotor's "short_leaf_runs" misses moves in its
// fast table (valid, slower schedules: flagged against the reference program's optimum).
//
// The budget is a promise on the measured peak (memoryLimitBytes): what was live at the
// step's start, less x[0], plus the budget. The model is exact to the byte on the chain
// workloads and on the imported ResNet-18, DenseNet-121 and ViT (the step's own terms
// included, chain.h), so a schedule the solver fits within
// the budget stays within it when it runs.
//
// Cost: the schedule's recomputed forwards; memory: the simulator's peak for the profiled
// chain, which the record compares with the peak the tracking allocator measured.

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <mutex>
#include <optional>
#include <stdexcept>

#include "harness/error.h"
#include "harness/measure/memory.h"
#include "harness/measure/step_trace.h"
#include "harness/measure/update_profile.h"
#include "harness/registry.h"
#include "reference/autograd_engine.h"
#include "reference/chain_nets.h"
#include "reference/torchscript/import.h"
#include "reference/torchscript/linearize.h"
#include "reference/training.h"
#include "strategies/checkpointing/profiler.h"
#include "strategies/checkpointing/run_schedule.h"
#include "strategies/checkpointing/solvers.h"
#include "strategies/checkpointing/solvers_testing.h"

namespace sb::strategies::checkpointing {
namespace {

using harness::Applicability;
using harness::CaseSpec;
using reference::ChainNet;

enum class Fault {
  kNone,
  kNoRngRestore,
  kStaleInput,
  kRngLeftAfterRecompute,
  kIgnoreBudget,
  kKeepInputToEnd,
  kShortLeafRuns
};

const char* faultName(Fault f) {
  switch (f) {
    case Fault::kNone:
      return "none";
    case Fault::kNoRngRestore:
      return "no_rng_restore";
    case Fault::kStaleInput:
      return "stale_input";
    case Fault::kRngLeftAfterRecompute:
      return "rng_left_after_recompute";
    case Fault::kIgnoreBudget:
      return "ignore_budget";
    case Fault::kKeepInputToEnd:
      return "keep_input_to_end";
    case Fault::kShortLeafRuns:
      return "short_leaf_runs";
  }
  return "?";
}

// The generator state dropout draws from, kept outside the tensor allocator: the default CPU
// generator's (a Mersenne Twister copy) and, for a stage on a GPU, that device's default
// generator's (CUDA's Philox seed and offset, as torch.utils.checkpoint's get/set_rng_state
// keep them): every dropout on a GPU tensor draws from the latter and advances its offset.
class RngSnapshot {
 public:
  RngSnapshot() = default;
  static RngSnapshot take(const c10::Device& device) {
    RngSnapshot s;
    s.state_ = cpuGenerator()->clone();
    if (!device.is_cpu()) s.device_ = {device, reference::devicePhiloxState(device)};
    return s;
  }
  bool held() const { return state_ != nullptr; }
  void restore() const {
    at::CPUGeneratorImpl* g = cpuGenerator();
    {
      std::lock_guard<std::mutex> lock(g->mutex_);
      g->set_engine(state_->engine());
      g->set_next_float_normal_sample(state_->next_float_normal_sample());
      g->set_next_double_normal_sample(state_->next_double_normal_sample());
    }
    if (device_) reference::setDevicePhiloxState(device_->first, device_->second);
  }
  void clear() {
    state_.reset();
    device_.reset();
  }
  // As the results compare them: the CPU generator's get_state(), and a GPU's [seed, offset].
  at::Tensor cpuState() const { return at::Tensor(state_->get_state()); }
  at::Tensor deviceState() const {
    return at::tensor(
        {static_cast<int64_t>(device_->second.seed), static_cast<int64_t>(device_->second.offset)},
        at::kLong);
  }

 private:
  static at::CPUGeneratorImpl* cpuGenerator() {
    return at::check_generator<at::CPUGeneratorImpl>(at::detail::getDefaultCPUGenerator());
  }
  std::shared_ptr<at::CPUGeneratorImpl> state_;
  std::optional<std::pair<c10::Device, reference::PhiloxState>> device_;
};

// The chain's values as a trace names them: x[i], stage i's input; x[i + 1], its output.
std::string stageInput(int i) { return "x[" + std::to_string(i) + "]"; }
std::string stageOutput(int i) { return stageInput(i + 1); }

// The plain chain's trace (harness/trace_value.h) on `net`, from the step's start (generator
// seeded, buffers reset): every stage's output (what a recomputation must give again too), and
// the gradient of every stage's input, as the backward of that stage makes it.
std::vector<harness::TraceValue> stageTrace(const ChainNet& net, uint64_t seed) {
  net.resetBuffers();
  at::manual_seed(reference::ChainWorkload::dropoutSeed(seed));
  std::vector<at::Tensor> xs = {tapeInput(net.input())};
  std::vector<harness::TraceValue> out;
  for (int i = 0; i < net.numStages(); ++i) {
    xs.push_back(net.stage(i, xs.back(), true));
    out.push_back({net.stageName(i), "forward", stageOutput(i), xs.back().detach(), {}});
  }
  const at::Tensor loss = (xs.back() * net.target()).sum();
  // x[0] of ids takes no gradient: the others are the stages' outputs.
  const size_t from = xs[0].requires_grad() ? 0 : 1;
  const auto grads = torch::autograd::grad(
      {loss}, std::vector<at::Tensor>(xs.begin() + static_cast<std::ptrdiff_t>(from), xs.end()), {},
      false, false, true);
  for (int i = net.numStages(); i-- > static_cast<int>(from);) {
    if (!grads[i - from].defined()) continue;
    out.push_back({net.stageName(i), "backward", "grad " + stageInput(i), grads[i - from], {}});
  }
  net.resetBuffers();
  return out;
}

// Runs a schedule's operations on a network, holding what the schedule says is held.
class ScheduleRunner {
 public:
  ScheduleRunner(const ChainNet& net, const std::vector<Op>& ops, Fault fault, int rank)
      : net_(net),
        ops_(ops),
        fault_(fault),
        rank_(rank),
        L_(net.numStages()),
        recomputed_(L_, false) {
    // Only a stage that runs forward twice needs its generator state kept (a RngSnapshot),
    // and only until its backward.
    std::vector<int> runs(L_, 0);
    for (const Op& op : ops_) {
      if (op.isForward() && ++runs[op.stage] > 1) recomputed_[op.stage] = true;
    }
  }

  // The operations before the loss; returns x[L].
  at::Tensor forwardPhase(const at::Tensor& x0) {
    reset();
    forwardRuns_.assign(L_, 0);
    heldAfter_.assign(ops_.size(), std::numeric_limits<double>::quiet_NaN());
    x_[0] = x0.detach();
    for (; pc_ < ops_.size() && ops_[pc_].kind != Op::Kind::kLoss; ++pc_) run(ops_[pc_]);
    TORCH_INTERNAL_ASSERT(pc_ < ops_.size(), "a schedule without the loss");
    note(ops_[pc_]);
    lossAt_ = pc_;
    ++pc_;
    at::Tensor y = value(L_);
    x_[L_] = at::Tensor();  // the loss reads x[L] and frees it where it is held on its own
    return y;
  }

  // The operations after the loss, from d[L]; returns d[0].
  at::Tensor backwardPhase(const at::Tensor& dL) {
    d_[L_] = dL;
    measureHeld(lossAt_);  // the loss ran (outside the runner): what its model says it leaves
    for (; pc_ < ops_.size(); ++pc_) run(ops_[pc_]);
    at::Tensor d0 = d_[0];
    reset();
    return d0;
  }

  // Measures what is held after each operation of the next steps: the tracked bytes over
  // `start` (what was live when the step began, x[0] among it), as the simulator counts
  // (Simulation::heldAfter). Until called, nothing is measured.
  void measureFrom(int64_t start) { measureStart_ = start; }
  // After the last step: what was held after each operation (NaN: not measured).
  const std::vector<double>& heldAfter() const { return heldAfter_; }

  // How many times each stage's forward ran in the last step: what the schedule recomputed.
  const std::vector<int>& forwardRuns() const { return forwardRuns_; }
  // Locating a failure (harness/run/divergence.h): while set, every stage's output as each
  // forward makes it (a recomputation's under phase "recompute") and every d[i] as each backward
  // makes it are appended here, in the schedule's order (stageTrace names them).
  void captureInto(std::vector<harness::TraceValue>* out) { capture_ = out; }

 private:
  void measureHeld(size_t k) {
    if (measureStart_ < 0 || k >= heldAfter_.size()) return;
    heldAfter_[k] =
        static_cast<double>(harness::MemoryTracker::instance().current(rank_) - measureStart_);
  }

  void reset() {
    pc_ = 0;
    x_.assign(L_ + 1, at::Tensor());
    tapeIn_.assign(L_ + 1, at::Tensor());
    tapeOut_.assign(L_ + 1, at::Tensor());
    d_.assign(L_ + 1, at::Tensor());
    firstDone_.assign(L_, false);
    rng_.assign(L_, RngSnapshot());
  }

  // The input of stage i's forward: x[i], except under the stale-input fault, where a
  // recomputation reads the slot of the stage before when it holds a tensor of that shape.
  at::Tensor inputOf(int i) const {
    const at::Tensor v = value(i);
    if (fault_ == Fault::kStaleInput && firstDone_[i] && i > 0 && x_[i - 1].defined() &&
        x_[i - 1].sizes() == v.sizes()) {
      return x_[i - 1];
    }
    return v;
  }

  // x[i]'s value: held on its own, or as the output inside stage i-1's tape.
  at::Tensor value(int i) const {
    if (x_[i].defined()) return x_[i];
    TORCH_INTERNAL_ASSERT(i > 0 && tapeOut_[i].defined(), "x[", i, "] is not held");
    return tapeOut_[i].detach();
  }

  at::Tensor runStage(int i, const at::Tensor& input) {
    ++forwardRuns_[i];
    if (!firstDone_[i]) {
      firstDone_[i] = true;
      if (recomputed_[i]) rng_[i] = RngSnapshot::take(input.device());
      return net_.stage(i, input, /*updateBuffers=*/true);
    }
    const RngSnapshot now = RngSnapshot::take(input.device());
    if (fault_ != Fault::kNoRngRestore) rng_[i].restore();
    at::Tensor out = net_.stage(i, input, /*updateBuffers=*/false);
    if (fault_ != Fault::kNoRngRestore && fault_ != Fault::kRngLeftAfterRecompute) now.restore();
    return out;
  }

  // SB_MEMORY_TRACE: marks where each operation starts in the allocation trace.
  void note(const Op& op) const {
    if (auto& mem = harness::MemoryTracker::instance(); mem.tracing(rank_)) {
      mem.traceNote(rank_, ("op " + op.name()).c_str());
    }
  }

  void keep(const char* phase, int i, const std::string& tensor, const at::Tensor& t) {
    if (!capture_) return;
    capture_->push_back({net_.stageName(i), phase, tensor, t.detach().clone(),
                         harness::Box::whole(t.sizes()), harness::TraceValue::clockNs()});
  }

  void run(const Op& op) {
    note(op);
    // run --trace: the operation as a span (its name built only when traced).
    const harness::TraceScope span("schedule", harness::stepTracing() ? op.name() : std::string());
    const int i = op.stage;
    const char* phase = op.isForward() && firstDone_[i] ? "recompute" : "forward";
    switch (op.kind) {
      case Op::Kind::kForwardCheck:
      case Op::Kind::kForwardNoGrad: {
        c10::NoGradGuard noGrad;
        x_[i + 1] = runStage(i, inputOf(i));
        keep(phase, i, stageOutput(i), x_[i + 1]);
        if (op.kind == Op::Kind::kForwardNoGrad) x_[i] = at::Tensor();
        break;
      }
      case Op::Kind::kForwardEnable: {
        at::AutoGradMode grad(true);
        tapeIn_[i + 1] = tapeInput(inputOf(i));
        tapeOut_[i + 1] = runStage(i, tapeIn_[i + 1]);
        keep(phase, i, stageOutput(i), tapeOut_[i + 1]);
        break;
      }
      case Op::Kind::kBackward: {
        at::AutoGradMode grad(true);
        reference::backward({tapeOut_[i + 1]}, {d_[i + 1]});
        d_[i] = tapeIn_[i + 1].grad();  // none for x[0] of ids
        if (d_[i].defined()) keep("backward", i, "grad " + stageInput(i), d_[i]);
        d_[i + 1] = at::Tensor();
        tapeIn_[i + 1] = at::Tensor();
        tapeOut_[i + 1] = at::Tensor();
        // keep_input_to_end: the stage's input stays held until the step ends (a leak: every
        // number right, the peak only where the kept inputs meet it).
        if (fault_ != Fault::kKeepInputToEnd) x_[i] = at::Tensor();
        rng_[i].clear();
        break;
      }
      case Op::Kind::kLoss:
        TORCH_INTERNAL_ASSERT(false, "a second loss in the schedule");
    }
    measureHeld(pc_);
  }

  const ChainNet& net_;
  const std::vector<Op>& ops_;
  Fault fault_;
  int rank_;
  std::vector<harness::TraceValue>* capture_ = nullptr;
  int L_;
  size_t pc_ = 0;
  std::vector<at::Tensor> x_, tapeIn_, tapeOut_, d_;
  std::vector<RngSnapshot> rng_;
  std::vector<bool> firstDone_, recomputed_;
  std::vector<int> forwardRuns_;
  size_t lossAt_ = 0;
  int64_t measureStart_ = -1;
  std::vector<double> heldAfter_;
};

// The checkpointed chain as one autograd node: forward runs the schedule up to the loss,
// backward runs the rest of it.
// `anchor`: an empty leaf (no bytes) that takes a gradient, so that autograd records the node
// and runs its backward where x0 is ids and takes none (a node with no input that takes a
// gradient is not recorded).
struct CheckpointedChain : public torch::autograd::Function<CheckpointedChain> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x0,
                            const at::Tensor& anchor, int64_t runner) {
    ctx->saved_data["runner"] = runner;
    return reinterpret_cast<ScheduleRunner*>(runner)->forwardPhase(x0);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* runner = reinterpret_cast<ScheduleRunner*>(ctx->saved_data["runner"].toInt());
    return {runner->backwardPhase(grads[0]), at::Tensor(), at::Tensor()};
  }
  // The chain's step from its input as the caller holds it.
  static at::Tensor run(const at::Tensor& x0, ScheduleRunner& runner) {
    const at::Tensor anchor = at::empty({0}, x0.options().dtype(at::kFloat)).requires_grad_(true);
    return apply(x0, anchor, reinterpret_cast<int64_t>(&runner));
  }
};

class CheckpointStrategy;

class CheckpointExecutor final : public harness::RankExecutor {
 public:
  CheckpointExecutor(const CheckpointStrategy& s, CaseSpec c) : strategy_(s), case_(std::move(c)) {}

  void prepare(harness::RankContext& ctx, const reference::WorkloadData& data) override;
  void step(harness::RankContext& ctx) override;
  std::map<std::string, at::Tensor> results() const override;

  std::optional<int64_t> predictedPeakBytes() const override {
    // The model counts activations from x[0]; the rest of what is alive at the step's start
    // (parameters, gradients, the network's input) stays alive throughout. The step's own
    // terms (the output and loss it keeps, the loss gradient the autograd engine holds for
    // the chain's node) are in the profiled chain (chain.h: output_kept, loss_grad_kept).
    // Over steps, the optimizer's state is alive through every backward after the first, and
    // the update between backwards peaks at what its profile measured (prepare).
    const double backward = startLive_ - chain_.x[0] + schedule_.predictedPeak + laterStateBytes();
    return static_cast<int64_t>(std::llround(std::max(backward, startLive_ + updatePeak_)));
  }
  std::optional<double> predictedTimeUs() const override {
    const int steps = case_.training.enabled() ? case_.training.steps : 1;
    return schedule_.predictedTime * steps;
  }
  std::optional<int64_t> memoryLimitBytes() const override {
    if (budgetBytes_ <= 0) return std::nullopt;
    // The budget bounds the activations; over steps the optimizer's state and its update come
    // on top, as in any training loop.
    const double backward = startLive_ - chain_.x[0] + budgetBytes_ + laterStateBytes();
    return static_cast<int64_t>(std::llround(std::max(backward, startLive_ + updatePeak_)));
  }
  std::vector<std::pair<std::string, std::string>> recordParams() const override;
  nlohmann::json details() const override;
  // Locating a failure: the next step (its first optimizer step in training) keeps every
  // stage's output and input gradient as the schedule makes them (ScheduleRunner::captureInto).
  bool capturesValues() const override { return true; }
  void setCapture(bool on) override {
    captureOn_ = on;
    if (on) captured_.clear();
    if (!on && runner_) runner_->captureInto(nullptr);  // what a step that threw left
  }
  std::vector<harness::TraceValue> captured() const override { return captured_; }

 private:
  bool captureOn_ = false;
  std::vector<harness::TraceValue> captured_;
  const CheckpointStrategy& strategy_;
  CaseSpec case_;
  std::unique_ptr<ChainNet> net_;
  Chain chain_;
  Schedule schedule_;
  double budgetFraction_ = 0, budgetBytes_ = 0, nonePeak_ = 0;
  std::unique_ptr<ScheduleRunner> runner_;
  double startLive_ = 0;
  // What the schedule's simulation holds after each operation (Simulation::heldAfter), and
  // the last step()'s measurement against it: how many operations held more and how many
  // less, the one furthest off each way (the first of them), over every training step, and the
  // first operation that held more (where a leak starts).
  std::vector<double> predictedHeld_;
  struct HeldOff {
    int operations = 0;
    struct Worst {
      int count = 0, step = -1;
      size_t op = 0;
      double measured = 0, predicted = 0;
    } over, under, firstOver;
  } heldOff_;
  void judgeHeld(int step);
  // rotor's optimum checked in every row against the reference program (solveRotorReference:
  // the same recurrence filled by code it shares nothing of the fast table's fill with), where
  // that table is small enough: details.executor.optimum, and a prediction judged exactly.
  static constexpr int kSlots = 500;
  nlohmann::json optimum_;
  void checkOptimum(double budget);
  std::map<std::string, at::Tensor> results_;

  // Training over a case's steps (reference/training.h): the initial parameters every step()
  // starts from, the loop of the last step() (its results are written from it, after the
  // step, so that their copies are not part of the step's peak), the generator as that step
  // left it, and the update's profile: the most bytes above the step's start it holds (its
  // state, the norm's and the optimizer's temporaries), and the state's bytes.
  void trainSteps(harness::RankContext& ctx);
  double laterStateBytes() const {
    return case_.training.enabled() && case_.training.steps > 1 ? stateBytes_ : 0;
  }
  std::vector<at::Tensor> initialParams_;
  std::unique_ptr<reference::TrainingLoop> loop_;
  RngSnapshot rngAfter_;
  double updatePeak_ = 0, stateBytes_ = 0;
};

class CheckpointStrategy final : public harness::SingleRankStrategy {
 public:
  std::vector<std::string> caseParams() const override { return {"budget"}; }
  CheckpointStrategy(std::string solver, Fault fault)
      : SingleRankStrategy("checkpointing/" + solver, "checkpoint " + solver,
                           harness::Family::kCheckpointing),
        solver_(std::move(solver)),
        fault_(fault) {}

  const std::string& solver() const { return solver_; }
  Fault fault() const { return fault_; }

  // The profiled chain's simulation predicts the measured peak to the byte for every solver's
  // schedule (solver_execution_test.cpp executes them), so it is judged exactly.
  PredictionTolerance predictionTolerance() const override {
    return PredictionTolerance::exactMemory();
  }

  std::vector<std::pair<std::string, std::string>> params() const override {
    return {{"solver", solver_}, {"case params", "budget (fraction of keeping every tape)"}};
  }
  // Over a case's steps the schedule runs each step's forward and backward, and LibTorch's
  // optimizer updates the whole parameters between them (reference/training.h).
  bool trainsSteps() const override { return true; }

  void checkParams(const CaseSpec& c) const override {
    if (c.params.contains("budget")) {
      const auto& b = c.params["budget"];
      // (0, 1], as checkpointing/sac/budget reads the same key: a fraction of keeping every
      // tape (1 keeps them all; more would mean the same).
      if (!b.is_number() || !(b.get<double>() > 0) || !(b.get<double>() <= 1)) {
        throw harness::InputError("params.budget must be a positive fraction, at most 1, got " +
                                  b.dump());
      }
    }
  }

  Applicability applies(const CaseSpec& c) const override {
    if (c.workload == "torchscript") {
      // An imported model, linearised (reference/torchscript/linearize.h): its chain runs from
      // its first input (floating, which it differentiates, or ids, which its first stage
      // embeds); further inputs of ids or masks are read by every stage as constants.
      const auto spec = reference::torchscript::ImportSpec::fromJson(c.shape);
      for (size_t i = 1; i < spec.inputs.size(); ++i) {
        if (spec.inputs[i].dtype == "float") {
          return Applicability::unsupported(
              "a checkpointed chain runs from the model's first input, beside inputs of ids or "
              "masks every stage reads; input " +
              std::to_string(i + 1) + " of " + std::to_string(spec.inputs.size()) +
              " is floating, an activation the chain would not carry");
        }
      }
    } else if (!reference::findChainWorkload(c.workload)) {
      return Applicability::notApplicable("workload '" + c.workload + "' is not a chain network");
    }
    if (c.shape.is_object() && c.shape.value("microbatches", int64_t{1}) != 1) {
      return Applicability::notApplicable(
          "the reference accumulates micro-batches (shape key microbatches); checkpointing runs "
          "the whole batch");
    }
    if (c.meshSize() != 1) {
      return Applicability::unsupported("checkpointing runs on one rank; the mesh has " +
                                        std::to_string(c.meshSize()));
    }
    return Applicability::yes();
  }

  std::unique_ptr<harness::RankExecutor> makeExecutor(const CaseSpec& c) const override {
    return std::make_unique<CheckpointExecutor>(*this, c);
  }
  harness::Tolerance tolerance(const std::string&, const CaseSpec&,
                               const at::Tensor&) const override {
    return harness::Tolerance::bitwise(
        "recomputation repeats the same arithmetic on the same values, dropout masks included");
  }

  // The plain chain, stage by stage, from the net the executors build (stageTrace).
  std::vector<harness::TraceValue> referenceTrace(
      const CaseSpec& c, const reference::WorkloadData& data) const override {
    const auto net =
        c.workload == "torchscript"
            ? reference::torchscript::importedChainNet(
                  c.shape, data, reference::torchscript::ChainInput::kFloatingOrIds)
            : reference::findChainWorkload(c.workload)->makeNet(c.shape, c.dtype, c.seed);
    return stageTrace(*net, c.seed);
  }

  std::vector<std::string> plantableFaults() const override {
    std::vector<std::string> out;
    for (Fault f : faults()) out.push_back(faultName(f));
    return out;
  }
  std::unique_ptr<harness::Strategy> withPlantedFault(const std::string& name) const override {
    for (Fault f : faults()) {
      if (name == faultName(f)) return std::make_unique<CheckpointStrategy>(solver_, f);
    }
    return nullptr;
  }

 private:
  // The faults this solver's strategy can plant: short_leaf_runs is rotor's fast table's.
  std::vector<Fault> faults() const {
    std::vector<Fault> out = {Fault::kNoRngRestore, Fault::kStaleInput,
                              Fault::kRngLeftAfterRecompute, Fault::kIgnoreBudget,
                              Fault::kKeepInputToEnd};
    if (solver_ == "rotor") out.push_back(Fault::kShortLeafRuns);
    return out;
  }
  std::string solver_;
  Fault fault_;
};

void CheckpointExecutor::prepare(harness::RankContext& ctx, const reference::WorkloadData& data) {
  harness::MemoryTracker::instance().install();
  // An imported model's chain holds copies of the reference's tensors: its target is the
  // module's grad_output, so that the step's gradients are the module's. Copies, because
  // training steps the chain's parameters in place: on the data's own tensors every strategy
  // after this one (and the reference's trace) would start from this one's trained parameters.
  if (case_.workload == "torchscript") {
    reference::WorkloadData own;
    for (const auto& [name, t] : data.inputs) own.inputs[name] = t.clone();
    net_ = reference::torchscript::importedChainNet(
        case_.shape, own, reference::torchscript::ChainInput::kFloatingOrIds);
  } else {
    net_ =
        reference::findChainWorkload(case_.workload)->makeNet(case_.shape, case_.dtype, case_.seed);
  }
  chain_ = profileChain(*net_, ctx.rank());
  nonePeak_ = simulate(chain_, segmentSchedule(chain_.length(), {0})).peak;
  if (case_.params.contains("budget")) budgetFraction_ = case_.params["budget"].get<double>();
  // A budget is never below a byte: 0 bytes is the solvers' "no budget", and a fraction too
  // small for a byte is a budget nothing fits (unsupported), not an unlimited one.
  budgetBytes_ = budgetFraction_ > 0 ? std::max(1.0, std::floor(budgetFraction_ * nonePeak_)) : 0;
  const double solveBudget = strategy_.fault() == Fault::kIgnoreBudget ? 0 : budgetBytes_;
  std::optional<Schedule> s;
  {
    // short_leaf_runs: rotor's fast table with a recurrence that misses moves (valid, slower).
    std::optional<ScopedRotorFault> planted;
    if (strategy_.fault() == Fault::kShortLeafRuns) planted.emplace(RotorFault::kShortLeafRunsOnly);
    s = solve(strategy_.solver(), chain_, {solveBudget, kSlots});
  }
  if (!s) {
    // rotor finding none where its reference program finds a schedule is rotor's error, not
    // the case's: the row errors rather than reads as unsupported.
    if (strategy_.solver() == "rotor") {
      checkOptimum(solveBudget);
      const auto& r = optimum_.value("reference_time_us", nlohmann::json());
      if (r.is_number()) {
        throw std::runtime_error("rotor found no schedule within the budget of " +
                                 std::to_string(static_cast<int64_t>(budgetBytes_)) +
                                 " bytes where its reference program finds one of " +
                                 std::to_string(r.get<double>()) + " us");
      }
    }
    const auto full = solve("full", chain_, {0, kSlots});
    throw harness::UnsupportedCase("no " + strategy_.solver() + " schedule fits a budget of " +
                                   std::to_string(static_cast<int64_t>(budgetBytes_)) + " bytes (" +
                                   std::to_string(budgetFraction_) + " of keeping every tape, " +
                                   std::to_string(static_cast<int64_t>(nonePeak_)) +
                                   " bytes; checkpointing every stage needs " +
                                   std::to_string(static_cast<int64_t>(full->predictedPeak)) + ")");
  }
  schedule_ = *s;
  predictedHeld_ = simulate(chain_, schedule_.ops).heldAfter;
  if (strategy_.solver() == "rotor") checkOptimum(solveBudget);
  runner_ = std::make_unique<ScheduleRunner>(*net_, schedule_.ops, strategy_.fault(), ctx.rank());
  if (case_.training.enabled()) {
    for (const auto& [name, p] : net_->parameters()) initialParams_.push_back(p.detach().clone());
    // The update on copies of the parameters: its state, and the temporaries LibTorch's
    // optimizer allocates (measured, as the chain's stages are).
    const auto u = harness::profileUpdate(ctx.rank(), case_.training, net_->parameters());
    updatePeak_ = static_cast<double>(u.peak);
    stateBytes_ = static_cast<double>(u.stateBytes);
  }
}

void CheckpointExecutor::step(harness::RankContext& ctx) {
  // Every step starts from the reference's state: running statistics, zeroed gradients, the
  // dropout generator's seed.
  net_->resetBuffers();
  net_->zeroGrad();
  at::manual_seed(reference::ChainWorkload::dropoutSeed(case_.seed));
  if (case_.training.enabled()) {
    trainSteps(ctx);
    return;
  }
  startLive_ = static_cast<double>(harness::MemoryTracker::instance().current(ctx.rank()));
  heldOff_ = HeldOff();
  const at::Tensor x0 = tapeInput(net_->input());
  if (captureOn_) runner_->captureInto(&captured_);
  runner_->measureFrom(static_cast<int64_t>(startLive_));
  const at::Tensor y = CheckpointedChain::run(x0, *runner_);
  // The loss in its own statement: a temporary y * target would live until the end of the
  // full expression, through the whole backward.
  const at::Tensor loss = (y * net_->target()).sum();
  reference::backward({loss});
  runner_->captureInto(nullptr);
  judgeHeld(0);
  results_.clear();
  results_["output"] = y.detach();
  if (x0.grad().defined()) results_["grad_input"] = x0.grad();
  for (const auto& [name, p] : net_->parameters()) results_["grad/" + name] = p.grad();
  for (const auto& [name, b] : net_->buffers()) results_["buffer/" + name] = b;
  results_["rng/cpu"] = at::detail::getDefaultCPUGenerator().get_state();
  if (x0.is_cuda()) results_["rng/cuda"] = reference::deviceGeneratorState(x0.device());
}

void CheckpointExecutor::trainSteps(harness::RankContext& ctx) {
  // Every step() trains from the initial parameters with a new optimizer; the generator runs
  // on from its seed across the steps, and the running statistics from their initial values,
  // as in the reference's loop.
  results_.clear();
  loop_.reset();
  {
    const at::NoGradGuard noGrad;
    const auto& params = net_->parameters();
    for (size_t i = 0; i < params.size(); ++i) params[i].second.copy_(initialParams_[i]);
  }
  loop_ = std::make_unique<reference::TrainingLoop>(case_.training, net_->parameters());
  startLive_ = static_cast<double>(harness::MemoryTracker::instance().current(ctx.rank()));
  heldOff_ = HeldOff();
  for (int k = 0; k < case_.training.steps; ++k) {
    net_->zeroGrad();
    double loss = 0;
    {
      const at::Tensor x0 = tapeInput(net_->input());
      if (captureOn_ && k == 0) runner_->captureInto(&captured_);
      // Each step's operations over what was live when it began (the optimizer's state too).
      runner_->measureFrom(harness::MemoryTracker::instance().current(ctx.rank()));
      const at::Tensor y = CheckpointedChain::run(x0, *runner_);
      const at::Tensor l = (y * net_->target()).sum();
      reference::backward({l});
      runner_->captureInto(nullptr);
      judgeHeld(k);
      loss = l.item<double>();
    }
    loop_->update(loss);
  }
  rngAfter_ = RngSnapshot::take(net_->input().device());
}

std::map<std::string, at::Tensor> CheckpointExecutor::results() const {
  if (!loop_) return results_;
  std::map<std::string, at::Tensor> out;
  loop_->write(out);
  for (const auto& [name, b] : net_->buffers()) out["buffer/" + name] = b;
  out["rng/cpu"] = rngAfter_.cpuState();
  if (net_->input().is_cuda()) out["rng/cuda"] = rngAfter_.deviceState();
  return out;
}

std::vector<std::pair<std::string, std::string>> CheckpointExecutor::recordParams() const {
  std::vector<std::pair<std::string, std::string>> out = {
      {"solver", strategy_.solver()},
      {"budget", budgetFraction_ > 0 ? std::to_string(budgetFraction_) : "none"},
      {"budget_bytes", std::to_string(static_cast<int64_t>(budgetBytes_))},
      {"none_peak_bytes", std::to_string(static_cast<int64_t>(nonePeak_))},
      {"model_peak_bytes", std::to_string(static_cast<int64_t>(schedule_.predictedPeak))},
      {"recomputed_forwards", std::to_string(schedule_.recomputedForwards)},
      {"stages", std::to_string(chain_.length())}};
  if (case_.training.enabled()) {
    out.emplace_back("steps", std::to_string(case_.training.steps));
    out.emplace_back("optimizer", case_.training.optimizer.toString());
    out.emplace_back("update_peak_bytes", std::to_string(static_cast<int64_t>(updatePeak_)));
  }
  return out;
}

void CheckpointExecutor::checkOptimum(double budget) {
  // The reference's table: a double per (slot, i, l), filled in O(slots x L^3 / 6) moves; a
  // chain with the step's terms has two alive at once (solveRotor). Up to 120 stages: at most
  // 2 x 58 MiB and about 1.5 s on this machine's cores; longer chains are said unchecked.
  constexpr int kMaxStages = 120;
  if (chain_.length() > kMaxStages) {
    optimum_ = {{"checked", false},
                {"why", "the reference program is checked on chains of at most " +
                            std::to_string(kMaxStages) + " stages; this one has " +
                            std::to_string(chain_.length()) +
                            " (its table grows as the square "
                            "of the length, its filling as the cube)"}};
    return;
  }
  const auto started = std::chrono::steady_clock::now();
  const auto ref = solveRotorReference(chain_, {budget, kSlots});
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  optimum_ = {{"checked", true},
              {"against", "rotor's reference program (solveRotorReference)"},
              {"time_us",
               schedule_.ops.empty() ? nlohmann::json() : nlohmann::json(schedule_.predictedTime)},
              {"reference_time_us", ref ? nlohmann::json(ref->predictedTime) : nlohmann::json()},
              {"reference_recomputed_forwards", ref ? ref->recomputedForwards : -1},
              {"reference_seconds", secs}};
}

void CheckpointExecutor::judgeHeld(int step) {
  const auto& measured = runner_->heldAfter();
  for (size_t k = 0; k < measured.size() && k < predictedHeld_.size(); ++k) {
    if (std::isnan(measured[k])) continue;
    ++heldOff_.operations;
    const double off = measured[k] - predictedHeld_[k];
    if (off == 0) continue;
    if (off > 0 && heldOff_.firstOver.step < 0) {
      heldOff_.firstOver = {1, step, k, measured[k], predictedHeld_[k]};
    }
    HeldOff::Worst& w = off > 0 ? heldOff_.over : heldOff_.under;
    ++w.count;
    if (w.step < 0 || std::abs(off) > std::abs(w.measured - w.predicted)) {
      w.step = step;
      w.op = k;
      w.measured = measured[k];
      w.predicted = predictedHeld_[k];
    }
  }
}

nlohmann::json CheckpointExecutor::details() const {
  nlohmann::json j = {{"schedule", schedule_.names()},
                      {"chain", chain_.toJson()},
                      {"predicted_time_us", schedule_.predictedTime},
                      {"predicted_peak_bytes", schedule_.predictedPeak}};
  if (!optimum_.is_null()) {
    j["optimum"] = optimum_;
    if (optimum_.value("checked", false)) {
      // rotor claims the least time any schedule within the budget has (on its slots): the
      // reference program's is that least time, found independently; no reference schedule
      // (null) where rotor found one is as far off as it gets.
      const auto& r = optimum_["reference_time_us"];
      j["predictions"].push_back(
          {{"what", "solver_optimum"},
           {"about", r.is_number()
                         ? "rotor's schedule time, against the reference program's optimum"
                         : "rotor's schedule time, where the reference program finds "
                           "no schedule within the budget"},
           {"unit", "us"},
           {"measured", r.is_number() ? r.get<double>() : 0.0},
           {"predicted", schedule_.predictedTime},
           {"tolerance", 1e-12}});
    }
  }
  if (heldOff_.operations == 0) return j;
  // Memory after every operation, not only at the peak: a value held past the operation that
  // frees it (a leak) raises the peak only where it meets it, and is flagged here wherever it
  // is. The claim is one-sided: never more held than the schedule holds. Less is said, not
  // judged: a stage whose output is a view of its input (a flatten, a transpose) has both
  // counted by the chain, one storage in fact (docs/checkpointing.md).
  auto& h = j["held_after_operations"];
  h = {{"operations_measured", heldOff_.operations},
       {"over_the_model", heldOff_.over.count},
       {"under_the_model", heldOff_.under.count}};
  const auto describe = [&](const HeldOff::Worst& w) {
    return nlohmann::json{{"operation", schedule_.ops[w.op].name()},
                          {"index", w.op},
                          {"training_step", w.step},
                          {"measured_bytes", w.measured},
                          {"predicted_bytes", w.predicted}};
  };
  if (heldOff_.under.step >= 0) h["most_under"] = describe(heldOff_.under);
  if (heldOff_.over.step >= 0) {
    h["most_over"] = describe(heldOff_.over);
    // Judged with the row's other predictions, exactly (the record's "mispredicted"), where it
    // starts: the first operation that held more than the schedule.
    const HeldOff::Worst& w = heldOff_.firstOver;
    h["first_over"] = describe(w);
    j["predictions"].push_back(
        {{"what", "held_memory"},
         {"about",
          "memory held after " + schedule_.ops[w.op].name() + " (operation " +
              std::to_string(w.op) +
              (w.step > 0 ? " of training step " + std::to_string(w.step + 1) : std::string()) +
              "), over what the schedule holds"},
         {"unit", "bytes"},
         {"measured", w.measured},
         {"predicted", w.predicted},
         {"tolerance", 0.0}});
  }
  return j;
}

std::vector<std::unique_ptr<harness::Strategy>> registerCheckpointing() {
  std::vector<std::unique_ptr<harness::Strategy>> out;
  for (const auto& s : solverNames())
    out.push_back(std::make_unique<CheckpointStrategy>(s, Fault::kNone));
  return out;
}

}  // namespace

int ExecutedSchedule::totalForwards() const {
  int n = 0;
  for (int f : forwards) n += f;
  return n;
}

ExecutedSchedule executeSchedule(const ChainNet& net, const std::vector<Op>& ops, double x0Bytes,
                                 int rank) {
  auto& mem = harness::MemoryTracker::instance();
  TORCH_CHECK(mem.installed(), "executeSchedule needs the tracking allocator installed");
  const harness::ScopedMemoryRank scope(rank);
  ScheduleRunner runner(net, ops, Fault::kNone, rank);
  net.resetBuffers();
  net.zeroGrad();
  const int64_t start = mem.current(rank);
  mem.resetPeak(rank);
  {
    // As CheckpointExecutor::step: the loss in a statement of its own.
    const at::Tensor x0 = tapeInput(net.input());
    const at::Tensor y = CheckpointedChain::run(x0, runner);
    const at::Tensor loss = (y * net.target()).sum();
    reference::backward({loss});
  }
  ExecutedSchedule out;
  out.peak = static_cast<double>(mem.peak(rank) - start) + x0Bytes;
  out.forwards = runner.forwardRuns();
  return out;
}

}  // namespace sb::strategies::checkpointing

SB_REGISTER_STRATEGIES(sb::strategies::checkpointing::registerCheckpointing);
