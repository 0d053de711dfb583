// Sharded single operators: the strategy, its executor and its memory model (op_strategies.h),
// generic over the operators: what differs from one operator to the next is its rule
// (op_rule.h), one file per family of operators beside this one.
//
// Memory: the executor's step is a short program whose allocations are known from the local
// shapes (ATen's CPU kernels allocate their outputs and a few documented temporaries; autograd
// keeps what each node saves; the backend's collectives add their scratch). predictedPeakBytes
// replays that program on a counter, per rank, in the order the step runs it: the prediction is
// checked against the tracking allocator's measured peak on every row.

#include <ATen/ATen.h>

#include <algorithm>
#include <numeric>
#include <set>

#include "harness/comm/autograd_comm.h"
#include "harness/registry.h"
#include "harness/run/suite.h"
#include "reference/autograd_engine.h"
#include "strategies/sharding/ops/op_rule.h"
#include "strategies/sharding/ops/op_strategies.h"
#include "strategies/sharding/sharding_util.h"

namespace sb::strategies {
namespace {

using harness::Applicability;
using harness::Box;
using harness::CaseSpec;
using harness::Collective;
using harness::CommStats;
using harness::Communicator;
using harness::DeviceMesh;
using harness::Layout;
using harness::RankContext;
using reference::OpShape;
using Axes = std::vector<int>;

constexpr const char* kPrefix = "sharding/op/";

Axes sortedUnique(Axes a) {
  std::sort(a.begin(), a.end());
  a.erase(std::unique(a.begin(), a.end()), a.end());
  return a;
}

Axes minus(const Axes& a, const Axes& b) {
  Axes out;
  for (int x : a) {
    if (std::find(b.begin(), b.end(), x) == b.end()) out.push_back(x);
  }
  return out;
}

int64_t numelOf(const std::vector<int64_t>& s) {
  return std::accumulate(s.begin(), s.end(), int64_t{1}, std::multiplies<>());
}

using Resolved = ResolvedOp;

}  // namespace

Axes usedAxes(const Layout& l) {
  Axes a = l.partialAxes();
  for (const auto& d : l.dimAxes()) a.insert(a.end(), d.begin(), d.end());
  return sortedUnique(a);
}

// The axes over which operand i's gradient holds partial sums (see op_strategies.h).
Axes gradPartialOf(const OpStrategySpec& spec, const std::vector<Layout>& operands,
                   const std::vector<Layout>& outputs, size_t i) {
  // A bias is added after the pending sums are reduced: it meets only the output.
  if (spec.operands[i] == "bias") {
    Axes all;
    for (const auto& l : outputs) {
      for (const auto& d : l.dimAxes()) all.insert(all.end(), d.begin(), d.end());
    }
    return minus(sortedUnique(all), usedAxes(operands[i]));
  }
  Axes all;
  for (const auto& l : operands) {
    const Axes u = usedAxes(l);
    all.insert(all.end(), u.begin(), u.end());
  }
  for (const auto& l : outputs) {
    const Axes u = usedAxes(l);
    all.insert(all.end(), u.begin(), u.end());
  }
  return minus(sortedUnique(all), usedAxes(operands[i]));
}

namespace {

class OpStrategy;

class OpExecutor final : public harness::RankExecutor {
 public:
  OpExecutor(const OpStrategy& s, const CaseSpec& c);
  void prepare(RankContext& ctx, const reference::WorkloadData& data) override;
  void step(RankContext& ctx) override;
  std::map<std::string, at::Tensor> results() const override { return results_; }
  std::optional<int64_t> predictedPeakBytes() const override { return predicted_; }

 private:
  int64_t modelPeak(RankContext& ctx) const;

  const OpStrategy& strategy_;
  const CaseSpec& case_;
  Resolved r_;
  std::vector<at::Tensor> leaves_, gradOut_;
  std::vector<Box> operandBoxes_, outputBoxes_;
  std::map<std::string, at::Tensor> results_;
  std::optional<int64_t> predicted_;
  int rank_ = 0;
};

class OpStrategy final : public harness::Strategy {
 public:
  OpStrategy(OpStrategySpec spec, std::string fault)
      : Strategy(kPrefix + spec.op + "/" + compactName(spec.name), spec.name,
                 harness::Family::kSharding),
        spec_(std::move(spec)),
        fault_(std::move(fault)) {}

  const OpStrategySpec& spec() const { return spec_; }
  const std::string& fault() const { return fault_; }

  std::vector<std::string> plantableFaults() const override {
    return opRule(spec_.op).faults(spec_);
  }
  std::unique_ptr<harness::Strategy> withPlantedFault(const std::string& name) const override {
    const auto f = plantableFaults();
    if (std::find(f.begin(), f.end(), name) == f.end()) return nullptr;
    OpStrategySpec sp = spec_;
    // The softmax dimension sharded over the strategy's first axis (resolve() moves it there):
    // each rank normalises over its piece of the dimension only.
    if (name == "softmax_over_sharded_dim") sp.variant = "fault_softmax";
    return std::make_unique<OpStrategy>(sp, name);
  }

  std::vector<std::pair<std::string, std::string>> params() const override {
    std::string meshes;
    for (int d : spec_.meshDims) meshes += (meshes.empty() ? "" : ",") + std::to_string(d) + "-D";
    return {{"op", spec_.op}, {"set", spec_.set}, {"meshes", meshes}};
  }

  nlohmann::json sequences(const Resolved& r) const {
    nlohmann::json j = nlohmann::json::object();
    for (size_t i = 0; i < spec_.operands.size(); ++i) {
      j[spec_.operands[i]] = r.operands[i].sequence();
    }
    const auto names = r.shape.outputNames();
    for (size_t i = 0; i < names.size() && i < r.outputs.size(); ++i) {
      j[names[i]] = r.outputs[i].sequence();
    }
    return j;
  }

  nlohmann::json commJson(const Resolved& r) const {
    nlohmann::json actions = nlohmann::json::array();
    for (size_t i = 0; i < r.outputs.size(); ++i) {
      if (r.outputs[i].partialAxes().empty()) continue;
      actions.push_back(
          {{"phase", "forward"},
           {"collective", "all_reduce"},
           {"operand", r.shape.outputNames()[i]},
           {"mesh_axes", r.outputs[i].partialAxes()},
           {"why", spec_.variant == "vocab" ? "each rank looks up its vocabulary rows only"
                                            : "partial sums of a split reduction"}});
    }
    if (!r.statAxes.empty()) {
      for (const auto& [phase, what] : std::vector<std::pair<const char*, const char*>>{
               {"forward", "sum"},
               {"forward", "centred sum of squares"},
               {"backward", "sums of dy*w and dy*w*xhat"}}) {
        actions.push_back({{"phase", phase},
                           {"collective", "all_reduce"},
                           {"operand", what},
                           {"mesh_axes", r.statAxes},
                           {"why", "statistics over a split dimension"}});
      }
    }
    for (size_t i = 0; i < r.gradPartial.size(); ++i) {
      if (r.gradPartial[i].empty()) continue;
      actions.push_back({{"phase", "backward"},
                         {"collective", "all_reduce"},
                         {"operand", "grad_" + spec_.operands[i]},
                         {"mesh_axes", r.gradPartial[i]},
                         {"why", "replicated over axes whose ranks compute different parts"}});
    }
    return actions;
  }

  Resolved resolve(const CaseSpec& c) const {
    return resolveOp(spec_, OpShape::parse(c.shape), c.mesh);
  }

  nlohmann::json describe() const override {
    nlohmann::json seqs = nlohmann::json::object();
    for (size_t i = 0; i < spec_.operands.size(); ++i) {
      seqs[spec_.operands[i]] = spec_.operandLayouts[i].sequence();
    }
    if (!spec_.outputFromShape) {
      for (size_t i = 0; i < spec_.outputLayouts.size(); ++i) {
        seqs[spec_.outputLayouts.size() == 1 ? "output" : "output" + std::to_string(i)] =
            spec_.outputLayouts[i].sequence();
      }
    }
    nlohmann::json ranks = nlohmann::json::object();
    for (size_t i = 0; i < spec_.operands.size(); ++i)
      ranks[spec_.operands[i]] = spec_.operandRanks[i];
    return {{"op", spec_.op},
            {"set", spec_.set},
            {"variant", spec_.variant},
            {"sharding_sequences", seqs},
            {"operand_ranks", ranks}};
  }

  nlohmann::json caseDetails(const CaseSpec& c) const override {
    const Resolved r = resolve(c);
    return {{"sharding_sequences", sequences(r)}, {"communication", commJson(r)}};
  }

  Applicability applies(const CaseSpec& c) const override {
    if (c.workload != "op") return Applicability::notApplicable("not an op workload");
    const OpShape s = OpShape::parse(c.shape);
    if (s.op != spec_.op) return Applicability::notApplicable("another operator");
    if (s.operands() != spec_.operands) {
      return Applicability::notApplicable("generated for other operands");
    }
    if (const std::string why = opNotApplicable(spec_, s, c.mesh); !why.empty()) {
      return Applicability::notApplicable(why);
    }
    const Resolved r = resolve(c);
    if (!r.problem.empty()) return Applicability::unsupported(r.problem);
    return Applicability::yes();
  }

  std::unique_ptr<harness::RankExecutor> makeExecutor(const CaseSpec& c) const override {
    return std::make_unique<OpExecutor>(*this, c);
  }

  Box resultBox(const std::string& tensor, const CaseSpec& c, int rank) const override {
    const Resolved r = resolve(c);
    const DeviceMesh mesh(c.mesh);
    const auto coords = mesh.coords(rank);
    const auto outs = r.shape.outputs();
    const auto names = r.shape.outputNames();
    for (size_t i = 0; i < names.size(); ++i) {
      if (tensor == names[i]) return r.outputs[i].box(outs[i], c.mesh, coords);
    }
    for (size_t i = 0; i < spec_.operands.size(); ++i) {
      if (tensor == "grad_" + spec_.operands[i]) {
        return r.operands[i].box(r.shape.operandShape(spec_.operands[i]), c.mesh, coords);
      }
    }
    TORCH_INTERNAL_ASSERT(false, "no layout for tensor ", tensor);
  }

  // What the strategy's layouts require, whatever fault is planted: a fault that skips a
  // collective fails on the count as well as on the numbers.
  std::vector<std::pair<std::vector<int>, CommStats>> predictCommByGroup(const CaseSpec& c,
                                                                         int rank) const override {
    return opCommByGroup(resolve(c), c.mesh, rank, c.dtype);
  }
  std::optional<double> predictFlops(const CaseSpec& c, int rank) const override {
    return opFlops(resolve(c), c.mesh, rank);
  }
  std::optional<harness::LocalWork> predictLocalWork(const CaseSpec& c, int rank) const override {
    return opLocalWork(resolve(c), c.mesh, rank, c.dtype);
  }

  CommStats predictComm(const CaseSpec& c, int rank) const override {
    return totalComm(predictCommByGroup(c, rank));
  }

  harness::Tolerance tolerance(const std::string& tensor, const CaseSpec& c,
                               const at::Tensor& expected) const override {
    // A tensor whose computation sums partial results of ranks (a split contraction, split
    // statistics, a gradient all-reduced over ranks) adds in another order than the reference:
    // bounded by the longest sum the operator does.
    const harness::Tolerance base = Strategy::tolerance(tensor, c, expected);
    const Resolved r = resolve(c);
    const DeviceMesh mesh(c.mesh);
    int64_t parts = 1;
    const auto names = r.shape.outputNames();
    for (size_t i = 0; i < names.size(); ++i) {
      if (tensor == names[i]) parts = mesh.groupSize(r.outputs[i].partialAxes());
    }
    for (size_t i = 0; i < spec_.operands.size(); ++i) {
      if (tensor == "grad_" + spec_.operands[i]) parts = mesh.groupSize(r.gradPartial[i]);
    }
    if (!r.statAxes.empty()) parts = std::max(parts, mesh.groupSize(r.statAxes));
    int64_t length = 1;
    for (const auto& n : spec_.operands)
      length = std::max(length, numelOf(r.shape.operandShape(n)));
    for (const auto& o : r.shape.outputs()) length = std::max(length, numelOf(o));
    return harness::splitReductionTolerance(base, c.dtype, length, parts, expected);
  }

 private:
  OpStrategySpec spec_;
  std::string fault_;
};

OpExecutor::OpExecutor(const OpStrategy& s, const CaseSpec& c) : strategy_(s), case_(c) {}

void OpExecutor::prepare(RankContext& ctx, const reference::WorkloadData& data) {
  r_ = strategy_.resolve(case_);
  rank_ = ctx.rank();
  const auto coords = ctx.mesh().coords(ctx.rank());
  const auto& names = strategy_.spec().operands;
  for (size_t i = 0; i < names.size(); ++i) {
    const auto& shape = r_.shape.operandShape(names[i]);
    Box box = r_.operands[i].box(shape, case_.mesh, coords);
    operandBoxes_.push_back(box);
    if (strategy_.fault() == "batch_split_one_operand" && names[i] == "other") {
      box.offset[0] = 0;  // the batch split on the input only: every rank takes the first batches
    }
    at::Tensor t = harness::sliceBox(data.inputs.at(names[i]), box).clone();
    if (r_.shape.differentiable(names[i])) t.set_requires_grad(true);
    leaves_.push_back(t);
  }
  const auto outs = r_.shape.outputs();
  const auto outNames = r_.shape.outputNames();
  for (size_t i = 0; i < outs.size(); ++i) {
    const Box box = r_.outputs[i].box(outs[i], case_.mesh, coords);
    outputBoxes_.push_back(box);
    gradOut_.push_back(harness::sliceBox(data.inputs.at("grad_" + outNames[i]), box).clone());
  }
  predicted_ = modelPeak(ctx);
}

void OpExecutor::step(RankContext& ctx) {
  results_.clear();
  for (auto& l : leaves_) {
    if (l.requires_grad()) l.mutable_grad().reset();
  }
  std::vector<at::Tensor> outs = runOp(r_, ctx, leaves_, case_.seed, strategy_.fault());
  reference::backward(outs, gradOut_);
  const auto names = r_.shape.outputNames();
  for (size_t i = 0; i < outs.size(); ++i) results_[names[i]] = outs[i].detach();
  for (size_t i = 0; i < leaves_.size(); ++i) {
    if (leaves_[i].requires_grad())
      results_["grad_" + strategy_.spec().operands[i]] = leaves_[i].grad();
  }
}

int64_t OpExecutor::modelPeak(RankContext& ctx) const {
  MemoryReplay m(r_, ctx, strategy_.fault(), case_.dtype, leaves_, outputBoxes_,
                 r_.outputs[0].partialAxes());
  m.es = c10::elementSize(case_.dtype);
  // CPU kernels keep statistics in the accumulation type: float for float and the 16-bit types.
  m.statEs = case_.dtype == at::kDouble ? 8 : 4;
  int64_t base = 0;
  for (const auto& l : leaves_) base += l.nbytes();
  for (const auto& g : gradOut_) base += g.nbytes();
  m.X = leaves_[0].nbytes();
  m.n = leaves_[0].numel();
  for (const Box& b : outputBoxes_) m.O += b.numel() * m.es;
  m.g.assign(leaves_.size(), 0);
  for (size_t i = 0; i < leaves_.size(); ++i) {
    if (leaves_[i].requires_grad()) m.sumG += m.g[i] = leaves_[i].nbytes();
  }
  m.reduces = !m.outPartial.empty() && m.fault != "skip_output_all_reduce";
  opRule(r_.shape.op).memory(m);
  return base + m.peak;
}

}  // namespace

int64_t MemoryReplay::scratch(const Axes& axes, int64_t b) const {
  return ctx.mesh().groupSize(axes) > 1
             ? ctx.group(axes).scratchBytes(Collective::kAllReduce, b, b, dtype)
             : 0;
}

void MemoryReplay::dropPreviousResults(bool outputsAreViews, bool gradientsAreViews) {
  const int64_t previous = (outputsAreViews ? 0 : O) + (gradientsAreViews ? 0 : sumG);
  alloc(previous);
  release(previous);
}

void MemoryReplay::reduceCopy() {
  if (!reduces) return;
  alloc(O);
  alloc(scratch(outPartial, O));
  release(scratch(outPartial, O));
  release(O);
}

void MemoryReplay::gradAllReduces() {
  if (fault == "skip_grad_all_reduce") return;
  for (size_t i = 0; i < leaves.size(); ++i) {
    if (g[i] == 0 || r.gradPartial[i].empty()) continue;
    const int64_t sc = scratch(r.gradPartial[i], g[i]);
    alloc(g[i] + sc);
    release(g[i] + sc);
  }
}

at::Tensor LocalForward::reduce(const at::Tensor& y, size_t out) const {
  const Axes& p = r.outputs[out].partialAxes();
  if (p.empty() || fault == "skip_output_all_reduce") return y;
  return harness::allReduceFwdIdentityBwd(y, ctx.group(p));
}

Box LocalForward::operandBox(size_t i) const {
  return r.operands[i].box(r.shape.operandShape(r.spec.operands[i]), mesh, coords);
}

std::vector<std::string> commonFaults(const OpStrategySpec& spec,
                                      const std::vector<std::string>& own, int noGradient) {
  std::vector<std::string> f;
  bool partialOut = false;
  for (const auto& l : spec.outputLayouts) partialOut |= !l.partialAxes().empty();
  if (partialOut) f.push_back("skip_output_all_reduce");
  f.insert(f.end(), own.begin(), own.end());
  for (size_t i = 0; i < spec.operands.size(); ++i) {
    if (!gradPartialOf(spec, spec.operandLayouts, spec.outputLayouts, i).empty() &&
        static_cast<int>(i) != noGradient) {
      f.push_back("skip_grad_all_reduce");
      break;
    }
  }
  return f;
}

void keepLayouts(ResolvedOp&, const DeviceMesh&) {}

std::vector<at::Tensor> referenceForward(const LocalForward& f) {
  // The rest compute on their pieces exactly as on the whole tensor.
  std::map<std::string, at::Tensor> t;
  for (size_t i = 0; i < f.in.size(); ++i) t[f.r.spec.operands[i]] = f.in[i];
  return reference::opForward(f.r.shape, t, f.seed);
}

double noFlops(const ResolvedOp&, const std::vector<int64_t>&, int) { return 0.0; }

int64_t noStatistics(const Box&) {
  TORCH_INTERNAL_ASSERT(false, "statistics over ranks asked of an operator without them");
}

std::vector<OpStrategySpec> opStrategySpecs(const reference::OpShape& s) {
  return opRule(s.op).specs(s);
}

std::unique_ptr<harness::Strategy> makeOpStrategy(const OpStrategySpec& spec,
                                                  const std::string& fault) {
  return std::make_unique<OpStrategy>(spec, fault);
}

std::vector<Layout> ResolvedOp::reducedOutputs() const {
  std::vector<Layout> out;
  for (const auto& l : outputs) out.emplace_back(l.dimAxes(), std::vector<int>{});
  return out;
}

ResolvedOp resolveOp(const OpStrategySpec& spec, const OpShape& shape,
                     const std::vector<int64_t>& meshShape) {
  Resolved r;
  r.spec = spec;
  r.shape = shape;
  // The layouts for the case's shape: the generator's strategy of this name for it (names
  // that do not spell every dimension, such as an embedding's "RR = R x S0R", stand for one
  // strategy on ids of any rank).
  r.operands = spec.operandLayouts;
  r.outputs = spec.outputLayouts;
  for (const auto& sp : opStrategySpecs(r.shape)) {
    if (sp.name == spec.name) {
      r.operands = sp.operandLayouts;
      r.outputs = sp.outputLayouts;
      break;
    }
  }
  const DeviceMesh mesh(meshShape);
  // The operator's own layouts for the case (view: each input dimension's shards mapped to the
  // output).
  opRule(spec.op).layouts(r, mesh);
  if (!r.problem.empty()) return r;
  for (size_t i = 0; i < r.operands.size(); ++i) {
    r.gradPartial.push_back(r.shape.differentiable(spec.operands[i])
                                ? gradPartialOf(spec, r.operands, r.outputs, i)
                                : Axes{});
  }
  if (spec.variant == "hidden") r.statAxes = r.operands[0].axesOf(r.operands[0].ndim() - 1);
  if (spec.variant == "sync") r.statAxes = r.operands[0].axesOf(0);
  // Even shards, as ColossalAI requires; name the first dimension that does not divide.
  const auto check = [&](const std::string& what, const Layout& l,
                         const std::vector<int64_t>& shape) {
    for (int d = 0; d < l.ndim() && r.problem.empty(); ++d) {
      const int64_t parts = mesh.groupSize(l.axesOf(d));
      if (parts > 1 && shape[d] % parts != 0) {
        r.problem = what + " dimension " + std::to_string(d) + " (size " +
                    std::to_string(shape[d]) + ") does not divide evenly over mesh axes " +
                    Layout(std::vector<Axes>{l.axesOf(d)}, {}).compact() + " (" +
                    std::to_string(parts) + " ranks)";
      }
    }
  };
  for (size_t i = 0; i < r.operands.size(); ++i) {
    check(spec.operands[i], r.operands[i], r.shape.operandShape(spec.operands[i]));
  }
  const auto outs = r.shape.outputs();
  const auto names = r.shape.outputNames();
  for (size_t i = 0; i < r.outputs.size() && i < outs.size(); ++i) {
    check(names[i], r.outputs[i], outs[i]);
  }
  return r;
}

std::string opNotApplicable(const OpStrategySpec& spec, const OpShape& s,
                            const std::vector<int64_t>& mesh) {
  // The generator's strategies for this shape: one of this name, or this is not one of them.
  const auto mine = opStrategySpecs(s);
  if (std::none_of(mine.begin(), mine.end(),
                   [&](const OpStrategySpec& o) { return o.name == spec.name; })) {
    return "not generated for this shape";
  }
  const int meshNdim = static_cast<int>(mesh.size());
  if (std::find(spec.meshDims.begin(), spec.meshDims.end(), meshNdim) == spec.meshDims.end()) {
    return "not generated for a " + std::to_string(meshNdim) + "-D mesh";
  }
  if (meshNdim == 2 && spec.degenerateAxis >= 0) {
    const int other = 1 - spec.degenerateAxis;
    if (mesh[other] != 1 || mesh[spec.degenerateAxis] == 1) {
      return "for a 2-D mesh with one axis of extent 1";
    }
  }
  if (meshNdim == 1 && spec.degenerateAxis > 0) return "for a 2-D mesh with one axis of extent 1";
  if (spec.meshMustBeFull &&
      std::any_of(mesh.begin(), mesh.end(), [](int64_t e) { return e == 1; })) {
    return "for a 2-D mesh without axes of extent 1";
  }
  return "";
}

namespace {
// The statistics one rank all-reduces: a layer norm's one per row, a batch norm's one per
// channel.
int64_t statNumel(const Resolved& r, const std::vector<int64_t>& mesh,
                  const std::vector<int64_t>& coords) {
  const Box in = r.operands[0].box(r.shape.input, mesh, coords);
  return opRule(r.shape.op).statistics(in);
}
}  // namespace

std::vector<std::pair<std::vector<int>, CommStats>> opCommByGroup(
    const ResolvedOp& r, const std::vector<int64_t>& meshShape, int rank, at::ScalarType dtype) {
  const DeviceMesh mesh(meshShape);
  const auto coords = mesh.coords(rank);
  const int64_t es = c10::elementSize(dtype);
  std::vector<std::pair<std::vector<int>, CommStats>> out;
  const auto allReduce = [&](const Axes& axes, int64_t numel) {
    CommStats st;
    st.add(Collective::kAllReduce, mesh.groupSize(axes) > 1 ? numel * es : 0);
    out.emplace_back(axes, st);
  };
  const auto outs = r.shape.outputs();
  for (size_t i = 0; i < r.outputs.size(); ++i) {
    if (!r.outputs[i].partialAxes().empty()) {
      allReduce(r.outputs[i].partialAxes(), r.outputs[i].box(outs[i], meshShape, coords).numel());
    }
  }
  if (!r.statAxes.empty()) {
    const int64_t stats = statNumel(r, meshShape, coords);
    allReduce(r.statAxes, stats);      // forward: the sum
    allReduce(r.statAxes, stats);      // forward: the centred sum of squares
    allReduce(r.statAxes, 2 * stats);  // backward: both sums of the input gradient
  }
  for (size_t i = 0; i < r.gradPartial.size(); ++i) {
    if (r.gradPartial[i].empty()) continue;
    allReduce(
        r.gradPartial[i],
        r.operands[i].box(r.shape.operandShape(r.spec.operands[i]), meshShape, coords).numel());
  }
  return out;
}

// Floating-point operations of this rank's products, forward and backward (three products
// each of 2 x the local contraction): addmm, bmm, matmul and conv2d; none for the rest.
double opFlops(const ResolvedOp& r, const std::vector<int64_t>& mesh, int rank) {
  return opRule(r.shape.op).flops(r, mesh, rank);
}

// The memory traffic of the element-wise and reduction kernels, priced by the profile's copy
// fit: forward, the operands read and the outputs written; backward, the gradient seeds and
// saved operands read and the gradients written. A kernel per operand and output each way.
harness::LocalWork opLocalWork(const ResolvedOp& r, const std::vector<int64_t>& mesh, int rank,
                               at::ScalarType dtype) {
  const auto coords = DeviceMesh(mesh).coords(rank);
  const int64_t es = c10::elementSize(dtype);
  int64_t operands = 0, outputs = 0, grads = 0;
  for (size_t i = 0; i < r.spec.operands.size(); ++i) {
    const int64_t b =
        r.operands[i].box(r.shape.operandShape(r.spec.operands[i]), mesh, coords).numel() * es;
    operands += b;
    if (r.shape.differentiable(r.spec.operands[i])) grads += b;
  }
  const auto outs = r.shape.outputs();
  for (size_t i = 0; i < outs.size(); ++i) {
    outputs += r.outputs[i].box(outs[i], mesh, coords).numel() * es;
  }
  harness::LocalWork w;
  w.copies = 2 * static_cast<int64_t>(r.spec.operands.size() + outs.size());
  w.bytes = 2 * operands + 2 * outputs + grads;
  return w;
}

std::vector<at::Tensor> runOp(const ResolvedOp& r, RankContext& ctx,
                              const std::vector<at::Tensor>& local, uint64_t seed,
                              const std::string& fault) {
  std::vector<at::Tensor> in;
  for (size_t i = 0; i < local.size(); ++i) {
    const Axes& g = r.gradPartial[i];
    if (!g.empty() && local[i].requires_grad() && fault != "skip_grad_all_reduce") {
      in.push_back(harness::identityFwdAllReduceBwd(local[i], ctx.group(g)));
    } else {
      in.push_back(local[i]);
    }
  }
  // The statistics' group, or none when the planted fault skips their all-reduce.
  Communicator* statComm =
      r.statAxes.empty() || fault == "skip_stats_all_reduce" ? nullptr : &ctx.group(r.statAxes);
  const LocalForward f{
      r, ctx, in, seed, fault, statComm, ctx.mesh().coords(ctx.rank()), ctx.mesh().shape()};
  return opRule(r.shape.op).forward(f);
}

namespace {

// Canonical shapes whose strategy sets are registered up front (so `list` shows them), each
// operator's (its rule's canonicalShapes) in the order of kOpOrder; other ranks are generated
// when a case asks for them.
std::vector<nlohmann::json> canonicalShapes() {
  std::vector<nlohmann::json> out;
  for (const auto& op : opOrder()) {
    for (auto& shape : opRule(op).canonicalShapes()) out.push_back(std::move(shape));
  }
  return out;
}

std::vector<std::unique_ptr<harness::Strategy>> strategiesFor(const OpShape& s) {
  std::vector<std::unique_ptr<harness::Strategy>> out;
  for (const auto& sp : opStrategySpecs(s)) out.push_back(makeOpStrategy(sp));
  return out;
}

std::vector<std::unique_ptr<harness::Strategy>> registerCanonical() {
  std::vector<std::unique_ptr<harness::Strategy>> out;
  std::set<std::string> seen;
  for (const auto& shape : canonicalShapes()) {
    for (auto& st : strategiesFor(OpShape::parse(shape))) {
      if (seen.insert(st->id()).second) out.push_back(std::move(st));
    }
  }
  return out;
}

std::vector<std::unique_ptr<harness::Strategy>> generateForCase(const CaseSpec& c) {
  if (c.workload != "op") return {};
  return strategiesFor(OpShape::parse(c.shape));
}

}  // namespace
}  // namespace sb::strategies

// The canonical strategies need every operator's rule, registered by the family files in an
// order of their own (op_rule.h): registered once the last rule is in.
[[maybe_unused]] const bool kCanonicalRegistered =
    (sb::strategies::whenOpRulesComplete(
         [] { SB_REGISTER_STRATEGIES(sb::strategies::registerCanonical); }),
     true);
SB_REGISTER_STRATEGY_GENERATOR((sb::harness::StrategyRegistry::GeneratorInfo{
    "sharding/op/<op>/<strategy>", sb::harness::Family::kSharding,
    "the strategies of a single-operator case (workload op) for its operands' ranks, as "
    "ColossalAI's generators make them, where not registered for the canonical shapes",
    sb::strategies::generateForCase}));
