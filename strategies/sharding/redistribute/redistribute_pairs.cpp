// Redistribution between two layouts: the family `sharding/redistribute/<from>-><to>`.
//
// A case names a tensor shape and a mesh; its strategies are every ordered pair of a set of
// layouts (by default every layout nested in mesh order with at most one axis of pending sums:
// 24 for a 3-D tensor on a 2x2 mesh, so 576 pairs), or the set in the case's `params.layouts`.
// Each rank starts from its piece of the full input under `from` (under a partial layout, its
// share of a deterministic split of the piece into pending sums: small integers with exact
// inputs, so that any order of summation gives the same bits), and the step runs the planner's
// cheapest chain of steps (harness/redistribute.h) through autograd:
//   forward   the plan's steps, from `from` to `to`;
//   backward  from a grad_output laid out in dual(to) (Replicate and Partial swapped), the
//             transposed steps in reverse order, to a gradient in dual(from).
// The output is checked against the input and the input's gradient against grad_output, each
// on every element of every rank's piece (pending sums are reduced first, untimed and
// uncounted). Moving data changes no bits: with exact inputs, and wherever no pending sums are
// added, the comparison is bitwise. Communication: each step's collective on its axis group,
// forward and backward, counted by the backend and compared with the plan's prediction. Memory:
// the plan's allocations replayed per rank with the backend's scratch (redistribute_exec.h).

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <mutex>

#include "harness/registry.h"
#include "harness/run/suite.h"
#include "reference/autograd_engine.h"
#include "strategies/sharding/layout/redistribute_exec.h"

namespace sb::strategies {
namespace {

using harness::Applicability;
using harness::Box;
using harness::CaseSpec;
using harness::CommStats;
using harness::DeviceMesh;
using harness::Layout;
using harness::RankContext;
using harness::RedistFault;
using harness::RedistGeometry;
using harness::RedistPlan;

constexpr const char* kPrefix = "sharding/redistribute/";

RedistGeometry geometryOf(const CaseSpec& c) {
  return {reference::TensorShape::parse(c.shape).dims, c.mesh,
          static_cast<int64_t>(c10::elementSize(c.dtype))};
}

// The layout params' types and ranges, which need no shape: a non-empty list of strings, an
// integer from 0 to the mesh's axis count.
void checkLayoutParams(const CaseSpec& c) {
  if (c.params.contains("layouts")) {
    const auto& list = c.params.at("layouts");
    if (!list.is_array() || list.empty()) {
      throw harness::InputError(c.where() +
                                ": params key 'layouts' must be a non-empty list of "
                                "layouts such as \"[S01, R, R]\" or \"[Shard(0), Replicate()]\"");
    }
    for (const auto& item : list) {
      if (!item.is_string()) {
        throw harness::InputError(c.where() + ": params key 'layouts' holds " + item.dump() +
                                  ", which is not a layout string");
      }
    }
  }
  if (c.params.contains("max_partial")) {
    const auto& m = c.params.at("max_partial");
    if (!m.is_number_integer() || m.get<int64_t>() < 0 ||
        m.get<int64_t>() > static_cast<int64_t>(c.mesh.size())) {
      throw harness::InputError(c.where() +
                                ": params key 'max_partial' must be an integer from "
                                "0 to the mesh's axis count, got " +
                                m.dump());
    }
  }
}

// The case's layout set: `params.layouts` (any spelling), or every layout nested in mesh order
// with at most `params.max_partial` (default 1) partial axes.
std::vector<Layout> caseLayouts(const CaseSpec& c) {
  checkLayoutParams(c);
  const int ndim = static_cast<int>(reference::TensorShape::parse(c.shape).dims.size());
  const int meshNdim = static_cast<int>(c.mesh.size());
  std::vector<Layout> out;
  if (c.params.contains("layouts")) {
    for (const auto& item : c.params.at("layouts")) {
      try {
        out.push_back(Layout::parse(item.get<std::string>(), ndim, meshNdim));
      } catch (const harness::LayoutError& e) {
        throw harness::InputError(c.where() + ": params key 'layouts': " + e.what());
      }
    }
    return out;
  }
  const int maxPartial = c.params.contains("max_partial") ? c.params.at("max_partial").get<int>() : 1;
  return harness::enumerateLayouts(ndim, meshNdim, maxPartial);
}

harness::PlanObjective caseObjective(const CaseSpec& c) {
  if (!c.params.contains("objective")) return harness::PlanObjective::kBytes;
  const auto& o = c.params.at("objective");
  if (o == "time") return harness::PlanObjective::kTime;
  if (o == "bytes") return harness::PlanObjective::kBytes;
  throw harness::InputError(
      c.where() + ": params key 'objective' must be \"time\" or \"bytes\", got " + o.dump());
}

// Whether the group over `axes` has more than one rank: where pending sums really are pending.
bool anyRealAxis(const std::vector<int>& axes, const std::vector<int64_t>& mesh) {
  return RedistGeometry{{}, mesh, 0}.groupSize(axes) > 1;
}

// This rank's starting value of a tensor laid out in `layout`: its piece of `full`, or, under
// pending sums, its share of the piece. Shares 0..n-2 of a group are drawn from the seed (the
// same on every member, whose pieces are the same box); the last is the piece minus the others.
at::Tensor startingValue(const at::Tensor& full, const Layout& layout, const RedistGeometry& g,
                         const std::vector<int64_t>& coords, const CaseSpec& c, int stream) {
  const Box box = layout.box(g.shape, g.mesh, coords);
  at::Tensor piece = harness::sliceBox(full, box).clone();
  const auto& partial = layout.partialAxes();
  const int64_t n = g.groupSize(partial);
  if (n == 1) return piece;
  int64_t index = 0;
  for (int a : partial) index = index * g.mesh[a] + coords[a];
  at::Tensor rest = piece;
  for (int64_t k = 0; k + 1 < n; ++k) {
    at::Tensor share = reference::makeNormal(piece.sizes(), c.dtype, c.seed,
                                             stream + static_cast<int>(k), c.inputs);
    if (k == index) return share;
    rest = rest - share;
  }
  return rest.contiguous();
}

class PairStrategy;

class PairExecutor final : public harness::RankExecutor {
 public:
  PairExecutor(const PairStrategy& s, const CaseSpec& c) : strategy_(s), case_(c) {}
  void prepare(RankContext& ctx, const reference::WorkloadData& data) override;
  void step(RankContext& ctx) override;
  void settle(RankContext& ctx) override;
  std::map<std::string, at::Tensor> results() const override { return results_; }
  std::optional<int64_t> predictedPeakBytes() const override { return predictedPeak_; }
  std::vector<std::pair<std::string, std::string>> recordParams() const override;
  nlohmann::json details() const override;

 private:
  const PairStrategy& strategy_;
  const CaseSpec& case_;
  RedistGeometry g_;
  std::shared_ptr<const RedistPlan> plan_;
  std::unique_ptr<harness::RedistRunner> runner_;
  at::Tensor x_, gradOut_, y_;
  std::map<std::string, at::Tensor> results_;
  int64_t predictedPeak_ = 0;
};

class PairStrategy final : public harness::Strategy {
 public:
  std::string singleNode(const harness::CaseSpec&) const override { return "redistribute"; }
  std::vector<std::string> caseParams() const override {
    return {"layouts", "max_partial", "objective"};
  }
  PairStrategy(Layout from, Layout to, RedistFault fault = RedistFault::kNone)
      : Strategy(kPrefix + from.compact() + "->" + to.compact(),
                 from.sequence() + " -> " + to.sequence(), harness::Family::kSharding),
        from_(std::move(from)),
        to_(std::move(to)),
        fault_(fault) {}

  const Layout& from() const { return from_; }
  const Layout& to() const { return to_; }
  RedistFault fault() const { return fault_; }

  // The plan's replay of its steps' buffers predicts the peak to the byte (every pair of the
  // redistribute suite), so it is judged exactly.
  PredictionTolerance predictionTolerance() const override {
    return PredictionTolerance::exactMemory();
  }

  std::vector<std::pair<std::string, std::string>> params() const override {
    return {{"from", from_.sequence()}, {"to", to_.sequence()}};
  }

  nlohmann::json describe() const override {
    const int meshNdim = std::max(from_.maxAxis(), to_.maxAxis()) + 1;
    nlohmann::json j = {{"from", from_.sequence()}, {"to", to_.sequence()}};
    if (from_.meshOrdered() && meshNdim > 0) j["from_dtensor"] = from_.dtensor(meshNdim);
    if (to_.meshOrdered() && meshNdim > 0) j["to_dtensor"] = to_.dtensor(meshNdim);
    j["communication"] = "the planner's cheapest chain for the case's shape and mesh";
    return j;
  }

  void checkParams(const CaseSpec& c) const override {
    checkLayoutParams(c);
    caseObjective(c);
  }

  Applicability applies(const CaseSpec& c) const override {
    if (c.workload != "tensor") return Applicability::notApplicable("not a tensor workload");
    const auto dims = reference::TensorShape::parse(c.shape).dims;
    if (static_cast<int>(dims.size()) != from_.ndim()) {
      return Applicability::notApplicable("layouts of a " + std::to_string(from_.ndim()) +
                                          "-D tensor");
    }
    if (std::max(from_.maxAxis(), to_.maxAxis()) >= static_cast<int>(c.mesh.size())) {
      return Applicability::notApplicable("layouts of a mesh with more axes");
    }
    const auto set = caseLayouts(c);
    const auto in = [&](const Layout& l) {
      return std::find(set.begin(), set.end(), l) != set.end();
    };
    if (!in(from_) || !in(to_)) return Applicability::notApplicable("not in the case's layouts");
    return Applicability::yes();
  }

  std::unique_ptr<harness::RankExecutor> makeExecutor(const CaseSpec& c) const override {
    return std::make_unique<PairExecutor>(*this, c);
  }

  // The plan for a case's shape, mesh and dtype: planned once, shared by every rank.
  std::shared_ptr<const RedistPlan> planFor(const CaseSpec& c) const {
    const RedistGeometry g = geometryOf(c);
    const harness::PlanObjective objective = caseObjective(c);
    std::string key = reference::dimsString(g.shape) + "/" + c.meshString() + "/" +
                      std::to_string(g.elemSize) + "/" +
                      (objective == harness::PlanObjective::kTime ? "time" : "bytes");
    std::lock_guard<std::mutex> lock(mu_);
    auto it = plans_.find(key);
    if (it != plans_.end()) return it->second;
    auto plan = std::make_shared<const RedistPlan>(
        harness::planRedistribution(g, from_, to_, harness::RedistCostModel{}, objective));
    plans_[key] = plan;
    return plan;
  }

  Box resultBox(const std::string& tensor, const CaseSpec& c, int rank) const override {
    const RedistGeometry g = geometryOf(c);
    const auto coords = DeviceMesh(c.mesh).coords(rank);
    if (tensor == "output") return to_.box(g.shape, g.mesh, coords);
    if (tensor == "grad_input") return from_.box(g.shape, g.mesh, coords);
    TORCH_INTERNAL_ASSERT(false, "no layout for tensor ", tensor);
  }

  CommStats predictComm(const CaseSpec& c, int rank) const override {
    const RedistGeometry g = geometryOf(c);
    return planFor(c)->comm(g, positionOf(c, rank), true);
  }
  std::vector<std::pair<std::vector<int>, CommStats>> predictCommByGroup(const CaseSpec& c,
                                                                         int rank) const override {
    const RedistGeometry g = geometryOf(c);
    return planFor(c)->commByGroup(g, positionOf(c, rank), true);
  }
  // One node (singleNode): the plan's steps forward, the transposed ones backward.
  std::optional<std::vector<harness::NodeComm>> predictCommByNode(const CaseSpec& c,
                                                                  int rank) const override {
    const RedistGeometry g = geometryOf(c);
    const CommStats forward = planFor(c)->comm(g, positionOf(c, rank), false);
    CommStats backward = planFor(c)->comm(g, positionOf(c, rank), true);
    for (size_t k = 0; k < backward.entries.size(); ++k) {
      backward.entries[k].calls -= forward.entries[k].calls;
      backward.entries[k].bytes -= forward.entries[k].bytes;
    }
    return std::vector<harness::NodeComm>{{"redistribute", "forward", forward},
                                          {"redistribute", "backward", backward}};
  }
  // No matmuls: with a calibration profile the step is priced by its collectives and copies.
  std::optional<double> predictFlops(const CaseSpec&, int) const override { return 0.0; }
  std::optional<harness::LocalWork> predictLocalWork(const CaseSpec& c, int rank) const override {
    return planFor(c)->localWork(geometryOf(c), positionOf(c, rank), true);
  }

  // Moving data changes no bits. Sums of pending shares do: the output where `from` has pending
  // sums, the gradient where `to` has replicated axes (its gradient arrives as pending sums).
  harness::Tolerance tolerance(const std::string& tensor, const CaseSpec& c,
                               const at::Tensor& expected) const override {
    if (c.inputs == reference::InputMode::kExact) {
      return harness::Tolerance::bitwise("exact inputs: sums of small integers in any order");
    }
    const int meshNdim = static_cast<int>(c.mesh.size());
    const std::vector<int> summed =
        tensor == "output" ? from_.partialAxes() : to_.dual(meshNdim).partialAxes();
    if (!anyRealAxis(summed, c.mesh)) {
      return harness::Tolerance::bitwise("data movement only: no pending sums are added");
    }
    int64_t n = 1;
    for (int a : summed) n *= c.mesh[a];
    // n shares, each about as large as the values, are added in another order than they were
    // split off: n^2 terms' worth of rounding bounds it.
    return harness::splitReductionTolerance(Strategy::tolerance(tensor, c, expected), c.dtype,
                                            n * n, n, expected);
  }

  nlohmann::json caseDetails(const CaseSpec& c) const override {
    const RedistGeometry g = geometryOf(c);
    return {{"plan", planFor(c)->toJson(g, static_cast<int>(c.mesh.size()))},
            {"cost_model", harness::RedistCostModel{}.toJson()}};
  }

  std::vector<std::string> plantableFaults() const override {
    return {"reduce_scatter_wrong_group", "all_to_all_split_off_by_one"};
  }
  std::unique_ptr<Strategy> withPlantedFault(const std::string& name) const override {
    if (name == "reduce_scatter_wrong_group") {
      return std::make_unique<PairStrategy>(from_, to_, RedistFault::kReduceScatterWrongGroup);
    }
    if (name == "all_to_all_split_off_by_one") {
      return std::make_unique<PairStrategy>(from_, to_, RedistFault::kAllToAllSplitOffByOne);
    }
    return nullptr;
  }

  static int positionOf(const CaseSpec& c, int rank) {
    return static_cast<int>(harness::meshPosition(c.mesh, DeviceMesh(c.mesh).coords(rank)));
  }

 private:
  Layout from_, to_;
  RedistFault fault_;
  mutable std::mutex mu_;
  mutable std::map<std::string, std::shared_ptr<const RedistPlan>> plans_;
};

void PairExecutor::prepare(RankContext& ctx, const reference::WorkloadData& data) {
  g_ = geometryOf(case_);
  plan_ = strategy_.planFor(case_);
  const auto coords = ctx.mesh().coords(ctx.rank());
  const int meshNdim = static_cast<int>(case_.mesh.size());
  x_ = startingValue(data.inputs.at("input"), strategy_.from(), g_, coords, case_, 100)
           .set_requires_grad(true);
  gradOut_ = startingValue(data.inputs.at("grad_output"), strategy_.to().dual(meshNdim), g_, coords,
                           case_, 200);
  runner_ =
      std::make_unique<harness::RedistRunner>(g_, *plan_, ctx, case_.dtype, strategy_.fault());

  // The step's memory: the prepared input and gradient are held throughout; the previous step's
  // output and input gradient are still alive when the step starts; then the forward's steps,
  // then the backward's with the output alive.
  const int64_t base = x_.nbytes() + gradOut_.nbytes();
  const auto fwd = runner_->memory(base, false);
  const auto bwd = runner_->memory(fwd.live, true);
  predictedPeak_ = std::max({base + fwd.outBytes + bwd.outBytes, fwd.peak, bwd.peak});
}

void PairExecutor::step(RankContext&) {
  results_.clear();
  y_ = at::Tensor();
  x_.mutable_grad().reset();
  at::Tensor y = (*runner_)(x_);
  reference::backward({y}, {gradOut_});
  y_ = y.detach();
}

void PairExecutor::settle(RankContext& ctx) {
  const int meshNdim = static_cast<int>(case_.mesh.size());
  const auto reduced = [&](const at::Tensor& t, const std::vector<int>& partial) {
    if (!anyRealAxis(partial, case_.mesh)) return t;
    at::Tensor sum = t.contiguous().clone();
    ctx.group(partial).allReduce(sum);
    return sum;
  };
  results_["output"] = reduced(y_, strategy_.to().partialAxes());
  results_["grad_input"] = reduced(x_.grad(), strategy_.from().dual(meshNdim).partialAxes());
}

std::vector<std::pair<std::string, std::string>> PairExecutor::recordParams() const {
  return {{"path", plan_->path()},
          {"steps", std::to_string(plan_->steps.size())},
          {"plan_us", std::to_string(plan_->predictedUs)}};
}

nlohmann::json PairExecutor::details() const {
  return {{"plan", plan_->toJson(g_, static_cast<int>(g_.mesh.size()))}};
}

std::vector<std::unique_ptr<harness::Strategy>> generatePairs(const CaseSpec& c) {
  std::vector<std::unique_ptr<harness::Strategy>> out;
  if (c.workload != "tensor") return out;
  const auto layouts = caseLayouts(c);
  caseObjective(c);  // a malformed objective is an error now, not at the first row
  for (const auto& a : layouts) {
    for (const auto& b : layouts) out.push_back(std::make_unique<PairStrategy>(a, b));
  }
  return out;
}

}  // namespace
}  // namespace sb::strategies

SB_REGISTER_STRATEGY_GENERATOR((sb::harness::StrategyRegistry::GeneratorInfo{
    "sharding/redistribute/<from>-><to>", sb::harness::Family::kSharding,
    "every ordered pair of a tensor case's layouts (params.layouts, or all with at most "
    "params.max_partial partial axes), redistributed by the planner's cheapest plan",
    sb::strategies::generatePairs}));
