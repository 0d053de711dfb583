#pragma once

// Pipeline schedules as lists of actions per rank, and their dry run (no LibTorch: `solve
// pipeline` and its tests build in seconds).
//
// A model is cut into S stages; stage s runs on rank stageRank[s]. Each of M micro-batches goes
// forward through the stages in order (F), then backward in reverse: either one full backward
// (B), or, as Zero Bubble splits it, the input gradient (I), which the previous stage waits for,
// and the weight gradient (W), which nothing waits for. A rank runs its actions in its list's
// order; an action waits for what it needs:
//   F(s, m)  F(s - 1, m)                        (s > 0: the previous stage's activation)
//   B(s, m)  F(s, m) and B/I(s + 1, m)          (s < S - 1: the next stage's input gradient)
//   I(s, m)  as B(s, m)
//   W(s, m)  I(s, m)
// Action names are torch.distributed.pipelining's: stage, type, micro-batch ("1F0", "0B3",
// "2I1", "2W1"), and its CSV format: one row per rank, one action per cell (an empty cell is
// an idle slot).

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace sb::strategies::pipeline {

enum class Op { kForward, kBackward, kBackwardInput, kBackwardWeight };

struct Action {
  int stage = 0;
  Op op = Op::kForward;
  int microbatch = 0;
  std::string name() const;  // "1F0"
  bool operator==(const Action& o) const {
    return stage == o.stage && op == o.op && microbatch == o.microbatch;
  }
};

// "1F0", "0B3", "2I1", "2W1"; nullopt for anything else.
std::optional<Action> parseAction(const std::string& text);

// A malformed schedule or schedule file: the message names the file, line and cell, the rank,
// or the action, and what was expected.
class ScheduleError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Schedule {
  std::string name;  // "gpipe", "1f1b", ..., or the CSV file read
  int ranks = 0, stages = 0, microbatches = 0;
  std::vector<int> stageRank;                // per stage
  std::vector<std::vector<Action>> perRank;  // each rank's actions, in order
  bool splitBackward = false;                // I and W instead of B
  std::vector<int> stageFirstLayer;          // where a model was cut into the stages (or empty)
};

// The schedules built in: "gpipe" (every forward, then every backward), "1f1b" (Megatron's:
// S - 1 - r forwards to warm up, then one forward and one backward alternating), "zb-h1" (Zero
// Bubble's: 1F1B with the backward split, stage r running each W r input gradients after its I,
// so that the I's the earlier stages wait for go first and the W's fill the waits),
// "interleaved-1f1b" (Megatron's: `virtualStages`
// stages per rank, stage s on rank s mod ranks, micro-batches in groups of `ranks`). Throws
// ScheduleError for a kind it does not know or sizes it does not take.
std::vector<std::string> scheduleKinds();
Schedule makeSchedule(const std::string& kind, int ranks, int microbatches, int virtualStages = 1);

// The CSV format of torch.distributed.pipelining (_dump_csv / _load_csv): row r is rank r's
// actions. Stages, micro-batches and which rank holds each stage are read from the actions.
// Throws ScheduleError naming `file`, the line and cell on a malformed cell, a stage on two
// ranks, a missing or repeated action.
Schedule readScheduleCsv(const std::string& text, const std::string& file);
std::string scheduleCsv(const Schedule& s);

// Every (stage, micro-batch) has one F and one B (or one I and one W), on its stage's rank.
// Throws ScheduleError naming the first action that is missing, repeated or misplaced.
void validate(const Schedule& s);

// Cutting a model's L layers into `stages` contiguous stages: each stage's first layer (stage s
// holds layers [cut[s], cut[s + 1]); cut[stages] = L). By layer count (the first L mod S stages
// one layer more), or balanced: the cut that minimises the slowest stage's cost (forward plus
// backward), the linear-partition dynamic program over prefixes, O(L^2 S). Throws ScheduleError
// for fewer layers than stages or more than 4096 layers.
std::vector<int> evenStages(int layers, int stages);
std::vector<int> balanceStages(const std::vector<double>& layerCost, int stages);

// What each action costs, per stage (a profile's, or uniform: F 1, B 2, I 1, W 1 time units,
// one activation unit per micro-batch, none kept for W).
struct StageCost {
  double forwardUs = 1, backwardUs = 2, backwardInputUs = 1, backwardWeightUs = 1;
  double activationBytes = 1;  // held from a micro-batch's F to its B (or I)
  double weightGradBytes = 0;  // of those, held from I to W
  // A rank's memory action by action, where a profile measured it (the pipeline executor's
  // does, on one micro-batch): what an action leaves allocated (`net`: a backward's is
  // negative, it frees what its forward saved) and the most it holds above its start while it
  // runs (`peak`). The dry run walks each rank's actions in order: the rank's peak is the
  // largest (what is live before an action + that action's peak).
  struct Bytes {
    double net = 0, peak = 0;
  };
  Bytes forwardBytes, backwardBytes, backwardInputBytes, backwardWeightBytes;
};
struct Costs {
  std::vector<StageCost> stages;  // one per stage, or one for all
  double p2pUs = 0;               // per activation or gradient sent to another rank
  // Where ranks share compute (CPU ranks on one host's cores, as threads or processes): the
  // ranks of one host (`hostOf[rank]`, equal ids) share its `cores`, each rank's kernels
  // running on `threads` of them, so that cores / threads ranks compute at once. A stage's costs
  // are its time alone on the host; a rank whose action is ready waits for a core while they
  // are taken, in the order the ranks became ready, and runs its action to its end (an
  // operating system's time slice is longer than a pipeline action on a CPU); waiting for a
  // core is idle time. cores 0: each rank its own device (a GPU per rank): no rank waits for
  // another.
  struct Sharing {
    double cores = 0;  // a share of a host's where other replicas run beside
    int threads = 1;
    std::vector<int> hostOf;  // empty: every rank on one host
  } sharing;
  const StageCost& of(int stage) const {
    return stages.size() == 1 ? stages.front() : stages.at(static_cast<size_t>(stage));
  }
  // {"p2p_us": x, "cores": n, "threads": t, "host_of": [host id per rank], "stages":
  // [{"forward_us", "backward_us", "backward_input_us",
  // "backward_weight_us", "activation_bytes", "weight_grad_bytes", and per action kind
  // ("forward", "backward", "backward_input", "backward_weight") "<kind>_net_bytes" and
  // "<kind>_peak_bytes"}, ...]} (one entry, or one per stage). Throws ScheduleError naming
  // `file` and the key.
  static Costs fromJson(const std::string& text, const std::string& file, int stages);
};

struct TimedAction {
  Action action;
  double startUs = 0, endUs = 0;
};
struct RankTimeline {
  std::vector<TimedAction> actions;
  double busyUs = 0;
  double peakActivationBytes = 0;
  int peakMicrobatchesInFlight = 0;  // forwards done whose backward (I, or B) is not
  double peakBytes = 0;              // above the step's start, from the actions' Bytes
};
// The dry run: every rank's actions at the earliest time their dependencies allow, in their
// order (with Costs::sharing, in time order, each action stretched while its host's cores are
// oversubscribed). A schedule that cannot finish (a rank waiting for an action that never
// runs, or that it runs itself later) has `deadlock` set: the first waiting rank, its action and
// what it waits for, and `waiting` every waiting rank's.
struct Simulation {
  std::vector<RankTimeline> ranks;
  double stepUs = 0;          // the last action's end
  double bubbleFraction = 0;  // idle rank time over ranks x stepUs
  // Whether ranks slowed each other (Costs::sharing oversubscribed a host), and the sharing.
  bool coresShared = false;
  Costs::Sharing sharing;
  std::string deadlock;
  std::vector<std::string> waiting;
};
Simulation simulate(const Schedule& s, const Costs& c);

// A schedule CSV file a user names, read and checked on its own: a regular file of at most
// 16 MiB, in readScheduleCsv's format, whose dry run finishes (a schedule whose ranks would
// wait on each other forever is found in microseconds here, not after a collective timeout).
// Throws ScheduleError naming the file and what is wrong.
Schedule readScheduleFile(const std::string& file);

// The run as JSON (schedule, sizes, step time, bubble, per rank busy, idle, peak and the
// timed actions), as a value and as text, and as a Chrome trace (one thread per rank; Perfetto
// and chrome://tracing open it).
nlohmann::json simulationValue(const Schedule& s, const Simulation& sim);
std::string simulationJson(const Schedule& s, const Simulation& sim);
std::string chromeTrace(const Schedule& s, const Simulation& sim);

}  // namespace sb::strategies::pipeline
