#pragma once

// Auto-sharding a whole model: the cost model of a graph's sharding plans, the plans
// themselves, and the algorithms that choose one (Alpa's integer program, the hand-written
// Megatron plan, data parallel, replicated).
//
// A plan gives every node of a reference::Graph one of its operator's strategies
// (op_strategies.h): the layout each operand is read in and each output is written in. Where a
// node reads a value in another layout than its producer wrote it, the edge redistributes it
// (harness/redistribute.h's planner) in the forward, and the gradient back in the backward.
// Parameters live in the layout of their first reader; a later reader (the LM head reading the
// tied token embedding) redistributes them like any other edge.
//
// Costs, per rank, in microseconds, from a calibration profile (`stratbench calibrate`) or
// from bandwidths given as MASE takes them:
//   node      compute (the profile's matmul fit on the node's flops: three products each way),
//             its collectives (each priced on its axis group), its element-wise traffic (the
//             copy fit);
//   edge      the forward redistribution and the backward one, steps priced the same way;
//   step      the sum, plus the fixed cost of one SPMD step.
// Without a profile: a collective of S bytes over n ranks on axes T takes latency + S x
// busFactor(n) / bandwidth(T), bandwidth(T) the inter-node bandwidth where T includes mesh
// axis 0 and the intra-node one otherwise (Alpa's and MASE's mesh: axis 0 across nodes); a
// matmul runs at `gflops`; copies at `copy_gbps`.
//
// Memory, per rank: the tensors live at each point of the step (Alpa's liveness), walked over
// the graph in execution order: at the start the parameters, the inputs' slices and the
// gradient seed; in the forward each node's outputs until their last reader, and what each
// node saves for its backward (addmm's and bmm's operands, layer norm's input and statistics,
// softmax's output, GELU's input, dropout's mask) until its backward; in the backward the
// activations' gradients from their first to their last use and the parameters' gradients from
// their first. Views (split, permute, a view of a contiguous tensor) share their input's
// storage; a view of a permuted tensor copies. A node that saves a value it reads through an
// edge's redistribution saves the copy: where the value itself is kept too (another node saves
// it, a later reader needs it, a parameter), the copy's bytes are a pair term of the producer's
// (or the parameter owner's) and the saver's choices, counted only where their layouts differ
// (ilp.h's PairTerm, on the edge's pair variables). The integer program puts one memory row per
// program point of the first and last block and of the nodes outside the blocks: with repeated
// blocks sharing their choices, a point's live bytes are affine in the block's index, so those
// rows bound every other. Kernel temporaries (a softmax's scratch, a matmul's packed copies)
// are not in these rows: they are the program's estimate. A row's prediction is the replay of
// the chosen plan (plan_memory.h), which has them, to the byte.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/dist/cost_profile.h"
#include "reference/graph.h"
#include "strategies/sharding/auto/ilp.h"
#include "strategies/sharding/layout/placement.h"
#include "strategies/sharding/layout/redistribute.h"
#include "strategies/sharding/ops/op_strategies.h"

namespace sb::strategies::autoshard {

// The bandwidths a plan may be priced with (GB/s; `params.intra_node_bandwidth`, `solve shard
// --intra-node-bandwidth`): from a kilobyte a second to a petabyte a second, so that every
// priced cost stays far inside what the integer program holds.
inline constexpr double kMinBandwidthGBps = 1e-6;
inline constexpr double kMaxBandwidthGBps = 1e6;

// The largest cost one choice of a plan may have (microseconds; about 30 years): costs beyond
// it come from a profile or a bandwidth out of any real range, and refused as input before
// the integer program (CBC asserts on objective coefficients of 1e25 and more) sees them.
inline constexpr double kMaxChoiceCostUs = 1e15;

struct CostOptions {
  const harness::CostProfile* profile = nullptr;  // priced by it where given
  double intraGBps = 10.0;  // bandwidth of mesh axes inside a node (all but axis 0)
  double interGBps = 10.0;  // bandwidth of groups that include mesh axis 0
  double latencyUs = 10.0;  // per collective
  double gflops = 20.0;     // matmul rate without a profile
  double copyGBps = 10.0;   // element-wise traffic without a profile
  at::ScalarType dtype = at::kFloat;
};

// One node's strategy, resolved on the graph's shapes and priced.
struct Candidate {
  ResolvedOp op;
  std::vector<harness::Layout> outputs;  // after the forward's all-reduces
  // ZeRO-3 / FSDP: per operand that is a parameter this node owns, the layout it is stored in
  // when that is not the layout the operator reads (the operand's layout further split over the
  // mesh axes it leaves replicated): gathered at use by the node's edge, its gradient
  // redistributed back to the stored pieces. Empty: stored as read.
  std::map<size_t, harness::Layout> stored;
  double computeUs = 0, commUs = 0, localUs = 0;
  double us() const { return computeUs + commUs + localUs; }
  // Its forward again, as a recomputation runs it: one of the three products' time, the
  // forward's collectives, half the element-wise traffic (the forward's kernels).
  double forwardUs = 0;
  // The layout operand i exists in before the node reads it (stored, or as read).
  const harness::Layout& storedLayout(size_t i) const {
    const auto it = stored.find(i);
    return it != stored.end() ? it->second : op.operands[i];
  }
};

// Selective activation checkpointing in a plan's step (plan_memory.h replays it; the executor
// runs it through strategies/checkpointing/sac/): per node whether a policy keeps what it saves
// and its block (-1: outside every block), and per value the blocks whose recomputation reads
// it from the forward (held until then).
struct RecomputePolicy {
  std::vector<bool> save;
  std::vector<int> region;
  std::map<std::string, std::set<int>> heldBy;
};

// A policy priced by the search (ShardingModel::priceRecompute): the nodes its recomputation
// reruns (each one's forward paid again, its operands' forward redistributions too), what the
// liveness rows leave out (a block's dropped tensors, from their forward to the block's
// backward), and per plan the replay's policy (what a block's recomputation holds depends on
// which reads the plan redistributes into copies).
struct RecomputePricing {
  std::string policy;
  std::vector<bool> save, recomputed;
  std::vector<int> region;
  std::function<RecomputePolicy(const std::vector<int>& choice)> replayFor;
  // Per plan, the nodes recomputed (a plan's redistributions into copies add the nodes that
  // save them): the step's prediction (stepUs) pays these; the program, `recomputed`.
  std::function<std::vector<bool>(const std::vector<int>& choice)> recomputedFor;
};

struct PlanNode {
  std::string node;
  int candidate = -1;  // index into ShardingModel::candidates(node)
};

struct SolverInfo {
  std::string algo;    // ilp, megatron, data-parallel, replicated, file
  std::string status;  // the ILP's: optimal, feasible, ...; "hand-written" for the others
  double objectiveUs = 0, bound = 0, gap = 0;
  double seconds = 0;         // CBC's solve
  double programSeconds = 0;  // building the program (classes, costs, edges, memory rows)
  double totalSeconds = 0;    // the model (candidates, prices) and all of the above
  int variables = 0, constraints = 0, classes = 0;
  double memoryLimit = 0;
  int rounds = 1;            // solves: more where the replay found a plan over the limit
  double replaySeconds = 0;  // the replays of the plans' steps (plan_memory.h)
};

// One program point of the liveness rows: its live bytes, of which `during` are the node's own
// transient (live while it runs: a forward row is the node's peak, the bytes once it ran
// live_bytes - during).
struct LivenessPoint {
  std::string at;
  int64_t liveBytes = 0, during = 0;
};

class ShardingModel {
 public:
  ShardingModel(reference::Graph graph, std::vector<int64_t> mesh, CostOptions options);

  const reference::Graph& graph() const { return graph_; }
  const std::vector<int64_t>& mesh() const { return mesh_; }
  const CostOptions& options() const { return options_; }
  const std::vector<Candidate>& candidates(int node) const { return *candidates_.at(node); }
  // The candidate of `node` named `strategy`, or -1.
  int findCandidate(int node, const std::string& strategy) const;
  // A candidate whose operands and outputs are all replicated (added where the generator has
  // none, as for bmm).
  int replicatedCandidate(int node) const;
  // Every node's replicated candidate: one rank's plain step.
  std::vector<int> replicatedChoice() const {
    std::vector<int> out;
    for (size_t v = 0; v < graph_.nodes.size(); ++v) {
      out.push_back(replicatedCandidate(static_cast<int>(v)));
    }
    return out;
  }

  // Microseconds of moving a tensor of `shape` from `from` to `to` and its gradient back, by
  // the redistribution planner's cheapest paths (priced by the profile's fits, or by the
  // slower of the two bandwidths); infinite where no path exists.
  double edgeUs(const std::vector<int64_t>& shape, const harness::Layout& from,
                const harness::Layout& to) const;
  // edgeUs of every pair (from[a], to[b]), each layout looked up once.
  // `forwardTimes`: the forward's redistribution paid that many times (2: a recomputed reader
  // redistributes again in the backward).
  std::vector<std::vector<double>> edgeUsMatrix(const std::vector<int64_t>& shape,
                                                const std::vector<harness::Layout>& from,
                                                const std::vector<harness::Layout>& to,
                                                int forwardTimes = 1) const;
  // The layout in which `value` exists under `choice` (its producer's output, or a
  // parameter's first reader's operand layout); nullopt for the graph's inputs.
  std::optional<harness::Layout> valueLayout(const std::string& value,
                                             const std::vector<int>& choice) const;

  // Predicted step of a plan (one candidate per node).
  double stepUs(const std::vector<int>& choice) const;
  int64_t peakBytes(const std::vector<int>& choice) const;
  // Every program point's live bytes for a plan, in execution order ("forward, after N",
  // "backward of N"): where the peak is, and what the replay is compared with.
  std::vector<LivenessPoint> livenessRows(const std::vector<int>& choice) const;
  double stepOverheadUs() const;

  // The integer program over node classes (repeated blocks share one choice per role;
  // following nodes ride on their producer's choice), and the plan a selection means.
  struct Program {
    SelectionProblem problem;
    std::vector<int> classOf;                    // per node
    std::vector<std::vector<int>> memberChoice;  // per node: class choice -> candidate
  };
  Program program(double memoryLimit) const;
  std::vector<int> planOf(const Program& p, const std::vector<int>& selection) const;
  // The redistribution planner's cost model with these options (edges are planned with it).
  harness::RedistCostModel redistModel() const;

  // Test only (the planted fault rows_without_parameters): the liveness rows leave out the
  // parameters and their gradients, so that the program takes plans that do not fit.
  void plantRowsWithoutParameters() { rowsWithoutParameters_ = true; }
  bool rowsWithoutParameters() const { return rowsWithoutParameters_; }
  // Test only (the planted fault rows_free_early): the forward rows free each activation one
  // node before its last reader.
  void plantRowsFreeEarly() { rowsFreeEarly_ = true; }
  bool rowsFreeEarly() const { return rowsFreeEarly_; }
  // Test only (the planted fault program_without_parameter_edges): the program prices no edge
  // from a parameter's first reader to its other readers, so that it takes plans whose
  // objective is under their step priced node by node (stepUs).
  void plantProgramWithoutParameterEdges() { programWithoutParameterEdges_ = true; }

  // Prices a selective checkpointing policy into the program (its costs and rows), the step's
  // prediction (stepUs) and the replay of a plan's peak (ShardingPlan::predictMemory).
  void priceRecompute(std::shared_ptr<const RecomputePricing> p) { recompute_ = std::move(p); }
  const RecomputePricing* recomputePricing() const { return recompute_.get(); }

 private:
  std::shared_ptr<const RecomputePricing> recompute_;
  bool rowsWithoutParameters_ = false;
  bool rowsFreeEarly_ = false;
  bool programWithoutParameterEdges_ = false;
  int64_t bytes(const std::vector<int64_t>& shape, const harness::Layout& l) const;
  void addStoredVariants(int node, std::vector<Candidate>& cands) const;
  double commUs(const std::vector<int>& axes, const harness::CommStats& stats) const;
  double copyUs(const harness::LocalWork& w) const;

  reference::Graph graph_;
  std::vector<int64_t> mesh_;
  CostOptions options_;
  // Per node; nodes of the same shape and arguments share one set.
  std::vector<std::shared_ptr<const std::vector<Candidate>>> candidates_;
  std::map<std::string, int> firstReader_;  // parameter -> node index
  // The redistribution planner's layouts of one tensor shape as a graph: a layout's steps and
  // their prices are found once, however many sources a Dijkstra starts from (an edge's cost
  // matrix asks from every candidate's layout; on a 3-D mesh, hundreds).
  struct LayoutGraph {
    std::vector<int64_t> shape;
    std::map<harness::Layout, int> id;
    std::vector<harness::Layout> layouts;
    std::vector<std::vector<std::pair<int, double>>> steps;  // per layout, once expanded
    std::vector<bool> expanded;
    std::map<int, std::vector<double>> distances;  // per source: to every layout (inf: none)
    int idOf(const harness::Layout& l);
  };
  LayoutGraph& layoutGraph(const std::vector<int64_t>& shape) const;
  const std::vector<double>& distancesFrom(LayoutGraph& g, int from) const;
  mutable std::map<std::vector<int64_t>, LayoutGraph> layoutGraphs_;
};

// A plan as data: per node the strategy and the layouts of its arguments and results (the
// shape of MASE's exported solution), with the predictions and the solver's record.
struct ShardingPlan {
  std::string workload;
  nlohmann::json shape;
  std::vector<int64_t> mesh;
  std::vector<int> choice;  // per node, a candidate index
  SolverInfo solver;
  double predictedStepUs = 0;
  // The largest rank's peak: the replay's (plan_memory.h) where it has one, otherwise the
  // liveness rows' estimate.
  int64_t predictedPeakBytes = 0;
  int64_t livenessPeakBytes = 0;           // the integer program's rows at this plan
  std::vector<int64_t> replayedPeakBytes;  // per rank, by the replay; empty: none
  std::string notReplayed;                 // why not
  // Fills the three above: the replay of every rank's step on the threads backend.
  void predictMemory(const ShardingModel& m);

  nlohmann::json toJson(const ShardingModel& m) const;
  // Reads a plan written by toJson for the model's graph and mesh; throws harness::InputError
  // naming `file` and the key (a node missing, a strategy the node does not have, layouts that
  // are not the strategy's).
  static ShardingPlan fromJson(const nlohmann::json& j, const ShardingModel& m,
                               const std::string& file);
};

struct SolveOptions {
  std::string algo = "ilp";  // ilp, megatron, data-parallel, replicated
  double memoryLimit = 0;    // bytes per rank, <= 0: none
  double timeLimitSeconds = 60;
  double relativeGap = 0;  // fraction
  // megatron: the mesh axis tensor parallelism uses (the others data parallel); -1: the last
  // (Megatron-LM's: tensor parallel inside a node, whose links are the fast ones).
  int tpAxis = -1;
};

// The plan of `algo`. Throws NoPlanError when no plan fits the memory limit (with the least
// the model needs) or the hand-written plan does not apply to the shape.
class NoPlanError : public std::runtime_error {
 public:
  NoPlanError(const std::string& what, double minimumBytes)
      : std::runtime_error(what), minimumBytes_(minimumBytes) {}
  double minimumBytes() const { return minimumBytes_; }

 private:
  double minimumBytes_;
};
ShardingPlan solvePlan(const ShardingModel& m, const SolveOptions& o);
const std::vector<std::string>& planAlgos();

// Cost options from a case's or the command line's parameters: cost_profile (a profile's
// JSON), intra_node_bandwidth / inter_node_bandwidth (GB/s).
CostOptions costOptionsFrom(const nlohmann::json& params, harness::CostProfile* storage,
                            at::ScalarType dtype);

}  // namespace sb::strategies::autoshard
