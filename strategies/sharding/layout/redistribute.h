#pragma once

// Redistribution between layouts: the steps, their cost, and the planner that chains them.
//
// A redistribution moves a tensor from one layout to another through a sequence of steps. Each
// step acts on one group of mesh axes T (the ranks that differ only along T, ranked row-major
// over T in the order given, which is the order in which T nests):
//   slice           R(T) -> S(d): each rank keeps its chunk; no communication.
//   all_gather      S(d) -> R(T), T the innermost axes of d: the group concatenates its pieces.
//   all_to_all      S(d) -> S(e), T the innermost axes of d, appended innermost to e: each rank
//                   sends member j the part of its piece that j holds afterwards.
//   all_reduce      P(T) -> R(T): the group sums its pending sums.
//   reduce_scatter  P(T) -> S(d): the group sums, and each rank keeps its chunk.
//   partition       R(T) -> P(T): the rank of group index 0 keeps the values, the others zeros.
//   pad             S(d) -> P(T): each rank zero-pads its chunk to the group's whole piece.
// A step over several axes at once (T = {0, 1}: "S01 -> R" in one all-gather over the whole 2x2
// mesh) is one collective instead of one per axis, which moves fewer bytes: gathering axis 1
// then axis 0 sends half the tensor and then all of it; gathering both at once sends it once.
// A step over axes of extent 1 moves nothing (a relabelling).
//
// Every step is linear in the ranks' local tensors, and its transpose is again a step:
// slice <-> pad, all_gather <-> reduce_scatter, all_to_all <-> the reverse all_to_all,
// all_reduce <-> all_reduce, partition <-> partition. The backward of a redistribution runs
// the transposed steps in reverse order on the gradient, whose layout is the dual (Replicate and
// Partial swapped) of the tensor's.
//
// The planner finds the cheapest chain by Dijkstra over layouts, each step priced by the
// slowest rank: a collective as latency + bytes / bandwidth of its axis group (from a
// calibration profile, or the documented default below), a local step as its copy.
// The anchors the planner is compared with (ColossalAI's, DTensor's) are in
// redistribute_anchors.h.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/comm/comm.h"
#include "harness/dist/cost_profile.h"
#include "strategies/sharding/layout/placement.h"

namespace sb::harness {

enum class StepKind { kSlice, kAllGather, kAllToAll, kAllReduce, kReduceScatter, kPartition, kPad };
const char* stepKindName(StepKind k);  // "slice", "all_gather", ...

struct RedistStep {
  StepKind kind = StepKind::kSlice;
  std::vector<int> axes;  // the group T, outermost first
  int dim = -1;           // the dimension sliced, gathered, padded, scattered or sent from
  int toDim = -1;         // all_to_all: the dimension received along

  // The collective this step issues, if any.
  std::optional<Collective> collective() const;
  std::string toString() const;  // "all_gather(S0 -> R, dim 1, axes 0)"
  bool operator==(const RedistStep& o) const {
    return kind == o.kind && axes == o.axes && dim == o.dim && toDim == o.toDim;
  }
};

// The layout after `step`, or nullopt when the step cannot act on `from`.
std::optional<Layout> applyStep(const Layout& from, const RedistStep& step);
// The transpose of `step` taken from `before`: it acts on dual(after) and yields dual(before).
RedistStep transposeStep(const RedistStep& step);
// Every step that can act on `from` on a mesh of `meshNdim` axes.
std::vector<RedistStep> candidateSteps(const Layout& from, int meshNdim);

// A tensor's full shape on a mesh, with its element size: what prices a step.
struct RedistGeometry {
  std::vector<int64_t> shape;
  std::vector<int64_t> mesh;
  int64_t elemSize = 4;

  int ranks() const;
  std::vector<int64_t> coords(int rank) const;  // row-major over the mesh
  int64_t groupSize(const std::vector<int>& axes) const;
  // The mesh coordinates of member `index` of the group over `axes` of the rank at `coords`.
  std::vector<int64_t> memberCoords(std::vector<int64_t> coords, const std::vector<int>& axes,
                                    int64_t index) const;
  int64_t localBytes(const Layout& l, int rank) const;
  // localBytes of every rank, each dimension's piece found once per coordinate of the axes
  // that split it (the same as asking rank by rank, in fewer boxes).
  std::vector<int64_t> localBytesOfRanks(const Layout& l) const;
};

// What one rank's step issues: the collective (nullopt for a local step or a group of one) and
// the bytes the Communicator counts for it (nccl-tests' size convention).
struct StepComm {
  std::optional<Collective> collective;
  int64_t bytes = 0;
};
StepComm stepComm(const RedistGeometry& g, const Layout& before, const RedistStep& step, int rank);
// The planner's byte price of a step: the most bytes any rank's Communicator counts for it (the
// slowest rank's, as the planner prices time). Tested against what the threads backend counts
// when the step runs (test/redistribute_price_test.cpp).
int64_t stepBytes(const RedistGeometry& g, const Layout& before, const RedistStep& step);

// Prices steps. The default model, used when no calibration profile is given, is a ring on a
// uniform network: a collective of nccl-tests size S over n ranks takes
//   latencyUs + S * busFactor(n) / (busGBps * 1e3)      [us; busFactor as nccl-tests: 2(n-1)/n
//                                                        for all-reduce, (n-1)/n otherwise]
// and a local step writes its output at copyGBps. With a profile (`stratbench calibrate`), each
// collective is priced by the profile's fit for its axis group; local steps keep the copy rate.
struct RedistCostModel {
  double latencyUs = 10.0;
  double busGBps = 10.0;
  double copyGBps = 20.0;
  const CostProfile* profile = nullptr;

  // Microseconds of the slowest rank.
  double stepUs(const RedistGeometry& g, const Layout& before, const RedistStep& step) const;
  nlohmann::json toJson() const;
};

enum class PlanObjective { kTime, kBytes };

struct RedistPlan {
  Layout from, to;
  std::vector<RedistStep> steps;
  std::vector<Layout> layouts;  // from, then the layout after each step
  double predictedUs = 0;       // forward, by the cost model it was planned with

  // "[R, S01, R] -> [R, S0, R] -> [S0, R, R]".
  std::string path() const;
  // Each rank's collectives of the forward (and, with `backward`, of the transposed steps too).
  CommStats comm(const RedistGeometry& g, int rank, bool backward = false) const;
  // The same per axis group, for a cost profile.
  std::vector<std::pair<std::vector<int>, CommStats>> commByGroup(const RedistGeometry& g, int rank,
                                                                  bool backward) const;
  // Each rank's copies outside the collectives (staging buffers, slices, padding, assembling
  // received blocks), forward and, with `backward`, the transposed steps: what RedistRunner
  // does, for the copy fit of a calibration profile.
  LocalWork localWork(const RedistGeometry& g, int rank, bool backward) const;
  // The largest total over ranks of the forward's counted bytes.
  int64_t maxRankBytes(const RedistGeometry& g) const;
  nlohmann::json toJson(const RedistGeometry& g, int meshNdim) const;
};

// Builds a plan from a list of steps, checking each; throws std::invalid_argument naming the
// step that cannot act on the layout it meets.
RedistPlan planFromSteps(const RedistGeometry& g, const Layout& from,
                         const std::vector<RedistStep>& steps, const RedistCostModel& model);

// The cheapest plan from `from` to `to` (Dijkstra over layouts; ties go to fewer bytes, then to
// fewer steps).
RedistPlan planRedistribution(const RedistGeometry& g, const Layout& from, const Layout& to,
                              const RedistCostModel& model,
                              PlanObjective objective = PlanObjective::kBytes);

}  // namespace sb::harness
