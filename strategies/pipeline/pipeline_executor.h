// The pipeline family's pieces (pipeline_strategy.cpp: the strategies, their plans, results,
// communication and tolerances; pipeline_executor.cpp: a rank's actions; pipeline_profile.cpp:
// the costs and bytes its dry run predicts with). Internal to strategies/pipeline/.
#pragma once

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "harness/comm/comm.h"
#include "harness/measure/update_profile.h"
#include "harness/strategy.h"
#include "reference/chain_nets.h"
#include "reference/training.h"
#include "strategies/pipeline/schedule.h"
#include "strategies/pipeline/split_backward.h"

namespace sb::strategies::pipeline {

using harness::CaseSpec;
using harness::RankContext;

// What a pipeline row claims of its bubble (the dry run's idle fraction against the measured
// step's): within this share of the measured fraction, or within kBubbleFloor of the step.
inline constexpr double kBubbleTolerance = 0.10, kBubbleFloor = 0.02;

enum class Fault { kNone, kGradTwice, kWarmupShort, kWeightBeforeInput, kSendWrongStage };
const char* faultName(Fault f);

// What a pipeline cuts into stages, known before the net is built (pipeline_model.cpp): a
// chain network (reference/chain_nets.h) of layers each mapping one tensor to the next.
//   - mlp_chain and gpt2_stack (no batch norm: a micro-batch's statistics are not the batch's,
//     and the chain workloads check the running ones); a parameter's layer is named by its
//     name's first component (layer<i>, h<l>, ln_f);
//   - an imported model (workload torchscript with shape key microbatches): its graph imported
//     on one micro-batch's rows and linearised from its one input, floating or ids
//     (reference/torchscript/linearize.h); a parameter's layers are the chain stages whose nodes
//     read it, more than one where it is tied (GPT-2's embedding, read again by its head).
struct ChainModel {
  int layers = 0;
  // Per boundary b = 0..layers (layer b's input; b = layers: the output): one micro-batch's bytes.
  std::vector<int64_t> boundaryBytes;
  std::vector<double> layerCost;  // what params.cut: balanced weighs
  bool imported = false;
  bool idsInput = false;  // the chain's input is ids: no gradient goes back from the first layer
  // Imported: every parameter's reading layers (ascending) and shape.
  std::map<std::string, std::vector<int>> readers;
  std::map<std::string, std::vector<int64_t>> paramShapes;
};
// Whether a pipeline cuts the workload (mlp_chain, gpt2_stack, torchscript).
bool cutsIntoStages(const std::string& workload);
// Null where the workload is none a pipeline cuts; throws where the case's shape is bad (an
// import error names the file and node). Cached per workload, shape and dtype.
std::shared_ptr<const ChainModel> chainModel(const CaseSpec& c);
// The chain layers reading a parameter, ascending.
std::vector<int> layersOf(const CaseSpec& c, const std::string& name);
// Every parameter's name and shape (a built-in chain's net is built for them).
std::vector<std::pair<std::string, std::vector<int64_t>>> parameterShapes(const CaseSpec& c);
// The case's chain network holding the reference's tensors (an imported model's parameters,
// input and grad_output are the torchscript workload's).
std::unique_ptr<reference::ChainNet> makeChainNet(const CaseSpec& c,
                                                  const reference::WorkloadData& data);

// What every rank agrees on, from the case.
struct Plan {
  Schedule schedule;
  int pp = 1, dp = 1;
  int microbatches = 1;  // per replica (the shape's, over the replicas)
  std::vector<int> cut;  // pipeline stage s holds chain stages [cut[s], cut[s + 1])
  bool inOrder = true;   // every stage's gradients accumulated in micro-batch order
  // The pipeline stage holding a chain layer.
  int stageOf(int layer) const {
    return static_cast<int>(std::upper_bound(cut.begin(), cut.end(), layer) - cut.begin() - 1);
  }
};

// The pipeline ranks holding a stage that reads any of `layers`, ascending: the ranks that sum
// a tied parameter's gradient.
std::vector<int> holdersOf(const Plan& p, const std::vector<int>& layers);

// The names a failure is located by (harness/run/divergence.h): stage s's output of replica d's
// micro-batch m, its input's gradient, and a parameter's gradient as its replica accumulated it
// up to micro-batch m (in-order schedules, where that is the reference's order).
std::string stageOutputName(const Plan& p, int stage, int d, int m);
std::string stageInputGradName(const Plan& p, int stage, int d, int m);
std::string accumulatedGradName(const Plan& p, const std::string& param, int d, int m);
// The reference's trace of those values: the case's chain cut as the plan cuts it, each
// micro-batch through the stages and back, accumulated in order.
std::vector<harness::TraceValue> pipelineReferenceTrace(const Plan& p, const CaseSpec& c,
                                                        const reference::WorkloadData& data);

// The tag of what is sent to stage s for micro-batch m: its activation (kind 0) or the gradient
// of its output (kind 1).
inline int tagOf(const Plan& p, int stage, int microbatch, int kind) {
  return (stage * p.schedule.microbatches + microbatch) * 2 + kind;
}

class PipelineExecutor final : public harness::RankExecutor {
 public:
  PipelineExecutor(Plan plan, Fault fault, const CaseSpec& c);
  void prepare(RankContext& ctx, const reference::WorkloadData& data) override;
  void step(RankContext& ctx) override;
  std::map<std::string, at::Tensor> results() const override { return results_; }
  void settle(RankContext& ctx) override;
  std::optional<double> predictedTimeUs() const override { return predictedStepUs_; }
  std::optional<int64_t> predictedPeakBytes() const override;
  std::vector<std::pair<std::string, std::string>> recordParams() const override;
  nlohmann::json details() const override { return details_; }
  // The measured bubble is over every step run, the timed ones too (settle()).
  bool detailsCoverTiming() const override { return true; }
  // Locating a failure: the next step's first iteration keeps every action's values as it
  // makes them (the names above).
  bool capturesValues() const override { return true; }
  void setCapture(bool on) override {
    capture_ = on;
    if (on) captured_.clear();
    if (!on) capturing_ = false;  // what a step that threw left
  }
  std::vector<harness::TraceValue> captured() const override { return captured_; }

 private:
  struct Stash {
    at::Tensor x, y;  // the stage's input (a leaf) and output
    WeightPass w;     // a split backward's, from I to W (split_backward.h)
  };
  // The stage's layers on x.
  at::Tensor stageForward(int stage, const at::Tensor& x) const;
  // The parameters stage `stage` reads (none for a stage of no parameters).
  const std::vector<at::Tensor>& paramsOf(int stage) const;
  void run(RankContext& ctx, const Action& a);
  void profile(RankContext& ctx);
  void timeStages(at::Tensor& mine, int reps);
  Costs::Sharing hostSharing(RankContext& ctx);
  nlohmann::json host_;  // the host's cores, its ranks and their kernel threads
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
  // Per layer boundary (layer b's input): one micro-batch's shape and its tensor's options
  // (what is received there, and the input's gradient sent back); and, until the profile is
  // done, micro-batch 0's value where this rank's stages take it.
  struct Boundary {
    std::vector<int64_t> shape;
    at::TensorOptions options;
    at::Tensor empty() const { return at::empty(shape, options); }
    int64_t bytes() const;
  };
  std::vector<Boundary> boundary_;
  std::map<int, at::Tensor> samples_;
  // Tied parameters (read by stages on several pipeline ranks); their gradients summed over
  // the holders after the step (sumTiedGradients).
  struct Tied {
    size_t owned = 0;          // in owned_
    std::vector<int> holders;  // pipeline ranks, ascending
    int index = 0;             // the parameter's place in the net (its exchange's tag)
  };
  std::vector<Tied> tied_;
  void sumTiedGradients(RankContext& ctx);
  std::map<std::string, int> stageOfParam_;  // a parameter one stage reads: that stage
  std::vector<bool> counted_;                // training: whose squares this rank's norm counts
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
  // Every pipeline step this rank ran (an iteration of step(): one, or the case's optimizer
  // steps): its actions' times from its start, their sum and its end; whether step()'s first
  // call (the harness's warm-up) ran it.
  struct StepRecord {
    std::vector<TimedAction> timeline;
    double busyUs = 0, endUs = 0;
    bool warmup = false;
  };
  std::vector<StepRecord> steps_;
  int stepCalls_ = 0;
  // The step's start, and the current action's compute (after what it received).
  std::chrono::steady_clock::time_point start_, computeStart_;
  std::optional<double> predictedStepUs_;
  Simulation predicted_;
  nlohmann::json details_ = nlohmann::json::object();
  std::map<std::string, at::Tensor> results_;
  bool capture_ = false, capturing_ = false;
  std::vector<harness::TraceValue> captured_;
  void keep(const char* phase, int stage, const std::string& tensor, const at::Tensor& t);
  // After stage s's last gradient pass of micro-batch m: its parameters' gradients so far.
  void keepAccumulated(int stage, int m);
};

}  // namespace sb::strategies::pipeline
