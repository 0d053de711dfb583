// Sharded single operators: the strategy, its executor and its memory model (op_strategies.h),
// generic over the operators, and their registration; the model they share with auto-sharding
// (resolution, communication, flops, runOp) is op_model.cpp. What differs from one operator to
// the next is its rule (op_rule.h), one file per family of operators beside this one.
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
#include "strategies/sharding/layout/spec_boxes.h"
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
      : Strategy(kPrefix + spec.op + "/" + compactName(spec.name),
                 spec.colossalName.empty() ? spec.name : spec.colossalName,
                 harness::Family::kSharding),
        spec_(std::move(spec)),
        fault_(std::move(fault)) {}

  const OpStrategySpec& spec() const { return spec_; }
  const std::string& fault() const { return fault_; }
  std::string singleNode(const CaseSpec&) const override { return spec_.op; }

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
    // getitem's likewise: each rank indexes its piece of the indexed dimension (getitem.cpp).
    if (name == "index_dim_sharded") sp.variant = "fault_getitem";
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
    for (const auto& [name, layout] : r.spec.buffers) j[name] = layout.sequence();
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
    for (const auto& [name, layout] : spec_.buffers) seqs[name] = layout.sequence();
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
    // ColossalAI's name for the case's shapes: a view's or getitem's follows them, while the
    // strategy's displayName is that of the shape it was registered for.
    return {{"colossalai_name", r.spec.colossalName.empty() ? r.spec.name : r.spec.colossalName},
            {"sharding_sequences", sequences(r)},
            {"communication", commJson(r)}};
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
  // One node, the operator (singleNode): its forward's collectives and its backward's.
  std::optional<std::vector<harness::NodeComm>> predictCommByNode(const CaseSpec& c,
                                                                  int rank) const override {
    std::vector<harness::NodeComm> out = {{spec_.op, "forward", {}}, {spec_.op, "backward", {}}};
    for (const auto& part : opCommParts(resolve(c), c.mesh, rank, c.dtype)) {
      out[part.backward ? 1 : 0].comm += part.comm;
    }
    return out;
  }

  // The boxes ColossalAI's name gives (harness::Strategy::specifiedBox), read from the name by
  // strategies/sharding/layout/spec_boxes.h, which shares no code with the layouts the
  // executor runs: the first operand's gradient has the operand's sequence (the name's first
  // after "=", or before "->"), and the output the name's left side where it is written
  // "OUT = ..." (a following operator's output, and getitem's, depend on the case's shapes,
  // not only on the name; a sum's pending output is reduced before it is compared). A
  // sequence that shards a dimension unevenly is not ColossalAI's (it requires even shards):
  // no claim.
  std::optional<SpecifiedBox> specifiedBox(const std::string& tensor, const CaseSpec& c, int rank,
                                           at::IntArrayRef fullShape) const override {
    std::string name = displayName();
    for (const char* tail : {" WITH SYNC_BN"}) {
      const auto at = name.find(tail);
      if (at != std::string::npos) name.erase(at);
    }
    const auto under = name.rfind('_');
    if (under != std::string::npos &&
        name.find_first_not_of("0123456789", under + 1) == std::string::npos) {
      name.erase(under);
    }
    std::string seq;
    const auto eq = name.find(" = ");
    const auto arrow = name.find(" -> ");
    if (tensor == "grad_" + spec_.operands.front()) {
      if (eq != std::string::npos) {
        seq = name.substr(eq + 3);
        for (const char* sep : {" x ", " dot ", " <"}) seq = seq.substr(0, seq.find(sep));
      } else if (arrow != std::string::npos) {
        seq = name.substr(0, arrow);
      }
    } else if (eq != std::string::npos && spec_.op != "getitem" &&
               resolve(c).shape.outputNames().size() == 1 &&
               tensor == resolve(c).shape.outputNames()[0]) {
      seq = name.substr(0, eq);
    } else if (arrow != std::string::npos && name.substr(arrow + 4) == "FULLY REPLICATED") {
      if (tensor != resolve(c).shape.outputNames()[0]) return std::nullopt;
      seq = "R";  // every dimension whole
    }
    if (seq.empty() || seq.find('P') != std::string::npos) return std::nullopt;
    if (seq == "R") {
      return SpecifiedBox{harness::Box::whole(fullShape),
                          "ColossalAI `" + displayName() + "` (" + tensor + ": replicated)"};
    }
    const auto dims = harness::parseColossalSequence(seq);
    if (!dims || dims->size() != fullShape.size()) return std::nullopt;
    for (size_t d = 0; d < dims->size(); ++d) {
      int64_t parts = 1;
      for (int a : (*dims)[d]) parts *= c.mesh.at(static_cast<size_t>(a));
      if (fullShape[d] % parts != 0) return std::nullopt;
    }
    return SpecifiedBox{harness::colossalSequenceBox(seq, fullShape, c.mesh, rank),
                        "ColossalAI `" + displayName() + "` (" + tensor + ": " + seq + ")"};
  }

  // Memory is judged exactly: every rule replays the step's allocations (op_rule.h,
  // MemoryReplay) from the local shapes, the kernels' documented temporaries and the backend's
  // scratch, and predicts the tracked peak to the byte, so any difference is a model bug that
  // the default 5% would hide. Time: no claim (the default).
  PredictionTolerance predictionTolerance() const override {
    return PredictionTolerance::exactMemory();
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
    if (parts > 1) return harness::splitReductionTolerance(base, c.dtype, length, parts, expected);
    // Nothing split, but a product or convolution summed by a kernel on other shapes (the
    // rank's pieces, or the whole tensors on a rank's thread) adds its terms in another order.
    const int64_t reduced = opRule(r.shape.op).reductionLength(r.shape, tensor);
    if (reduced > 1 && !expected.is_cuda()) {
      return harness::reorderedSumTolerance(base, c.dtype, reduced, expected);
    }
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
    if (strategy_.fault() == "heads_split_one_operand" && names[i] == "other") {
      box.offset[1] = 0;  // the heads split on the input only: every rank takes the first heads
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

std::unique_ptr<harness::Strategy> makeOpStrategy(const OpStrategySpec& spec,
                                                  const std::string& fault) {
  return std::make_unique<OpStrategy>(spec, fault);
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

std::vector<std::unique_ptr<harness::Strategy>> strategiesFor(const OpShape& s, int meshNdim = 2) {
  std::vector<std::unique_ptr<harness::Strategy>> out;
  for (const auto& sp : opStrategySpecs(s, meshNdim)) out.push_back(makeOpStrategy(sp));
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
  return strategiesFor(OpShape::parse(c.shape), static_cast<int>(c.mesh.size()));
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
