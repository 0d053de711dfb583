// Sharded Linear on a device mesh, as ColossalAI's auto-parallel linear handler shards it.
//
// A Linear computes y = x W^T + b. Logically it is a matrix product [M, K] x [K, N] with
//   M  the batch: every input dimension but the last, flattened;
//   K  in_features, the contraction;
//   N  out_features.
// A strategy splits each of M, K and N over a set of mesh axes (possibly none; an axis splits
// at most one of them). ColossalAI names a strategy by the sharding sequences of output, input
// and weight in logical [M, K] x [K, N] form: "S0S1 = S0R x RS1" splits M over axis 0 and N over
// axis 1; "RR = RS01 x S01R" splits K over both axes. Physically the M split lands on one of
// the input's leading dimensions, which ColossalAI enumerates as the suffixes "_0", "_1", "_2".
// Shards must be even; a shape that does not divide is reported unsupported, naming the
// dimension.
//
// Each rank holds x[M/|Am|, K/|Ak|], W[N/|An|, K/|Ak|], b[N/|An|] and computes a local product.
// The communication follows from which dimension each product contracts:
//   forward   y = x W^T contracts K: if K is split, each rank holds partial sums, all-reduced
//             over the K axes (ALLREDUCE_FWD_IDENTITY_BWD on the output). The bias is added
//             after that all-reduce, once.
//   backward  dx = dy W contracts N: if N is split, dx is partial over the N axes and is
//             all-reduced there (IDENTITY_FWD_ALLREDUCE_BWD on the input).
//             dW = dy^T x and db = sum(dy) contract M: if M is split, the weight and bias
//             gradients are partial over the M axes and are all-reduced there (ColossalAI's
//             gradient hook on a parameter replicated over those axes).
// So "S0S1 = S0R x RS1" costs no forward communication and, in backward, an all-reduce of dx
// over axis 1 and of dW and db over axis 0. Each rank communicates the bytes of its local
// tensor per all-reduce; that is the prediction compared with what the backend counts.
//
// On a 1-D mesh the same generator has one axis: data parallel "S0R = S0R x RR", row split
// "RR = RS0 x S0R", column split "RS0 = RR x RS0", and replicated "RR = RR x RR".
//
// This file is the strategy; its executor, whose memory model replays the step's allocations in
// the step's own order, is linear_mesh_executor.cpp. The family's shared names (planted faults,
// the generator's list) are linear_specs.cpp.

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include "harness/comm/autograd_comm.h"
#include "harness/measure/memory.h"
#include "harness/measure/update_profile.h"
#include "harness/registry.h"
#include "reference/autograd_engine.h"
#include "reference/training.h"
#include "strategies/sharding/layout/spec_boxes.h"
#include "strategies/sharding/linear/linear_mesh_executor.h"
#include "strategies/sharding/linear/linear_strategies.h"
#include "strategies/sharding/matmul_scratch.h"
#include "strategies/sharding/sharding_util.h"

namespace sb::strategies {
namespace {

using harness::Applicability;
using harness::Box;
using harness::CaseSpec;
using harness::Collective;
using harness::CommStats;
using harness::DeviceMesh;
using harness::RankContext;
using harness::ShardingSpec;
using reference::LinearShape;

std::string axesString(const std::vector<int>& axes) {
  std::string s;
  for (int a : axes) s += std::to_string(a);
  return s.empty() ? "-" : s;
}

using linear_mesh::Specs;

class LinearMeshStrategy final : public harness::Strategy {
 public:
  std::string singleNode(const harness::CaseSpec&) const override { return "linear"; }
  LinearMeshStrategy(LinearMeshSpec spec, int batchDim, PlantedFault fault, std::string id,
                     std::string display)
      : Strategy(std::move(id), std::move(display), harness::Family::kSharding),
        spec_(std::move(spec)),
        batchDim_(batchDim),
        fault_(fault) {}

  const LinearMeshSpec& spec() const { return spec_; }
  int batchDim() const { return batchDim_; }
  PlantedFault fault() const { return fault_; }

  // A contraction that is not split has no partial sums to lose; only a split batch has a
  // shard offset to get wrong; only a strategy that splits something on a 2-D mesh has two
  // axes to swap.
  std::vector<PlantedFault> supportedFaults() const {
    std::vector<PlantedFault> f;
    if (!spec_.inAxes.empty()) f.push_back(PlantedFault::kSkipForwardAllReduce);
    if (batchDim_ >= 0) f.push_back(PlantedFault::kShardOffsetOffByOne);
    const bool splits = !spec_.batchAxes.empty() || !spec_.inAxes.empty() || !spec_.outAxes.empty();
    if (splits && std::count(spec_.meshDims.begin(), spec_.meshDims.end(), 2)) {
      f.push_back(PlantedFault::kConsistentWrongLayout);
    }
    return f;
  }
  std::vector<std::string> plantableFaults() const override {
    return plantedFaultNames(supportedFaults());
  }
  std::unique_ptr<harness::Strategy> withPlantedFault(const std::string& name) const override {
    const auto f = parsePlantedFault(name, supportedFaults());
    if (!f) return nullptr;
    LinearMeshSpec spec = spec_;
    if (*f == PlantedFault::kConsistentWrongLayout) {
      // Mesh axes 0 and 1 swapped everywhere the executor and the declared layout look (the
      // name stays): "S0S1 = S0R x RS1" runs as S1S0 = S1R x RS0, and "S01R" as S10R, its
      // shards in reverse order. On a square mesh its numbers, communication and memory are
      // those of a right strategy; only its layout is not the named one.
      for (auto* axes : {&spec.batchAxes, &spec.inAxes, &spec.outAxes}) {
        for (int& a : *axes) a = 1 - a;
      }
    }
    return std::make_unique<LinearMeshStrategy>(spec, batchDim_, *f, id(), displayName());
  }

  std::vector<std::pair<std::string, std::string>> params() const override {
    std::string meshes;
    for (int d : spec_.meshDims) meshes += (meshes.empty() ? "" : ",") + std::to_string(d) + "-D";
    return {{"batch_axes", axesString(spec_.batchAxes)},
            {"in_axes", axesString(spec_.inAxes)},
            {"out_axes", axesString(spec_.outAxes)},
            {"batch_dim", batchDim_ < 0 ? "-" : std::to_string(batchDim_)},
            {"meshes", meshes}};
  }

  linear_mesh::Specs specsFor(const LinearShape& s) const {
    Specs sp;
    const int64_t nd = static_cast<int64_t>(s.input.size());
    sp.input = ShardingSpec::replicated(nd);
    sp.output = ShardingSpec::replicated(nd);
    if (batchDim_ >= 0) {
      sp.input.dimAxes[batchDim_] = spec_.batchAxes;
      sp.output.dimAxes[batchDim_] = spec_.batchAxes;
    }
    sp.input.dimAxes[nd - 1] = spec_.inAxes;
    sp.output.dimAxes[nd - 1] = spec_.outAxes;
    sp.weight = ShardingSpec{{spec_.outAxes, spec_.inAxes}};  // W is [N, K]
    sp.bias = ShardingSpec{{spec_.outAxes}};
    return sp;
  }

  nlohmann::json sequencesJson(const LinearShape& s) const {
    const Specs sp = specsFor(s);
    nlohmann::json j = {{"input", sp.input.sequence()},
                        {"weight", sp.weight.sequence()},
                        {"output", sp.output.sequence()}};
    if (s.bias) j["bias"] = sp.bias.sequence();
    return j;
  }

  nlohmann::json commJson() const {
    nlohmann::json actions = nlohmann::json::array();
    if (!spec_.inAxes.empty()) {
      actions.push_back({{"phase", "forward"},
                         {"collective", "all_reduce"},
                         {"operand", "output"},
                         {"mesh_axes", spec_.inAxes},
                         {"why", "partial sums of the split in_features contraction"}});
    }
    if (!spec_.outAxes.empty()) {
      actions.push_back({{"phase", "backward"},
                         {"collective", "all_reduce"},
                         {"operand", "grad_input"},
                         {"mesh_axes", spec_.outAxes},
                         {"why", "dx = dy W contracts the split out_features"}});
    }
    if (!spec_.batchAxes.empty()) {
      actions.push_back({{"phase", "backward"},
                         {"collective", "all_reduce"},
                         {"operand", "grad_weight"},
                         {"mesh_axes", spec_.batchAxes},
                         {"why", "dW = dy^T x contracts the split batch"}});
      actions.push_back({{"phase", "backward"},
                         {"collective", "all_reduce"},
                         {"operand", "grad_bias"},
                         {"mesh_axes", spec_.batchAxes},
                         {"why", "db = sum(dy) over the split batch"}});
    }
    return actions;
  }

  nlohmann::json describe() const override {
    // Shown for the seed's canonical case: input [4, 4, 4, 16], Linear(16, 32).
    LinearShape canonical{{4, 4, 4, 16}, 16, 32, true};
    return {{"sharding_sequences", sequencesJson(canonical)},
            {"sharding_sequences_for", "input [4, 4, 4, 16], Linear(16, 32)"},
            {"communication", commJson()}};
  }

  nlohmann::json caseDetails(const CaseSpec& c) const override {
    return {{"sharding_sequences", sequencesJson(LinearShape::parse(c.shape))},
            {"communication", commJson()}};
  }

  Applicability applies(const CaseSpec& c) const override {
    if (c.workload != "linear") return Applicability::notApplicable("not a linear workload");
    const int64_t meshDims = static_cast<int64_t>(c.mesh.size());
    if (std::find(spec_.meshDims.begin(), spec_.meshDims.end(), meshDims) == spec_.meshDims.end()) {
      return Applicability::notApplicable("not generated for a " + std::to_string(meshDims) +
                                          "-D mesh");
    }
    if (fault_ == PlantedFault::kConsistentWrongLayout && meshDims != 2) {
      return Applicability::notApplicable("the planted fault swaps two mesh axes");
    }
    const LinearShape s = LinearShape::parse(c.shape);
    const int64_t nd = static_cast<int64_t>(s.input.size());
    if (batchDim_ >= nd - 1) {
      return Applicability::notApplicable("the input has " + std::to_string(nd) +
                                          " dimensions, so dimension " + std::to_string(batchDim_) +
                                          " is not a batch dimension");
    }
    const DeviceMesh mesh(c.mesh);
    const Specs sp = specsFor(s);
    if (auto why = sp.input.cannotShard("input", s.input, mesh)) {
      return Applicability::unsupported(*why);
    }
    if (auto why = sp.weight.cannotShard("weight", s.weight(), mesh)) {
      return Applicability::unsupported(*why);
    }
    return Applicability::yes();
  }

  std::unique_ptr<harness::RankExecutor> makeExecutor(const CaseSpec& c) const override {
    return std::make_unique<linear_mesh::LinearMeshExecutor>(
        spec_, batchDim_, fault_, specsFor(LinearShape::parse(c.shape)), c);
  }

  harness::Tolerance tolerance(const std::string& tensor, const CaseSpec& c,
                               const at::Tensor& expected) const override {
    // Each tensor is a sum over one dimension; where that dimension is split across ranks the
    // partial sums are added in another order (and, in fp16/bf16, rounded once more) than the
    // reference adds them.
    const LinearShape s = LinearShape::parse(c.shape);
    if (c.training.enabled()) {
      // Over steps: each training tensor carries the rounding of the step's sums it comes
      // from (the loss: the output's; the norm, the weight and its state: the weight
      // gradient's; the bias: its gradient's), compounded over the steps.
      const bool bias = tensor.find("/bias") != std::string::npos;
      const std::string from = tensor == "loss" ? "output" : (bias ? "grad_bias" : "grad_weight");
      return harness::overSteps(splitTolerance(from, c, expected), c.dtype, c.training.steps,
                                expected);
    }
    return splitTolerance(tensor, c, expected);
  }

  // One step's: each tensor is a sum over one dimension, split or not.
  harness::Tolerance splitTolerance(const std::string& tensor, const CaseSpec& c,
                                    const at::Tensor& expected) const {
    const LinearShape s = LinearShape::parse(c.shape);
    const std::vector<int>* axes = nullptr;
    int64_t length = 0;
    if (tensor == "output") {
      axes = &spec_.inAxes;
      length = s.inFeatures;
    } else if (tensor == "grad_input") {
      axes = &spec_.outAxes;
      length = s.outFeatures;
    } else if (tensor == "grad_weight" || tensor == "grad_bias") {
      axes = &spec_.batchAxes;
      length = s.rows();
    }
    const harness::Tolerance base = Strategy::tolerance(tensor, c, expected);
    if (axes == nullptr) return base;
    // Even an unsplit sum is added in another order when the local matmul has another shape than
    // the reference's: BLAS blocks (and threads) by shape. Any split of M, K or N changes it.
    const bool reshaped =
        !spec_.batchAxes.empty() || !spec_.inAxes.empty() || !spec_.outAxes.empty();
    const int64_t parts = std::max<int64_t>(DeviceMesh(c.mesh).groupSize(*axes), reshaped ? 2 : 1);
    return harness::splitReductionTolerance(base, c.dtype, length, parts, expected);
  }

  Box resultBox(const std::string& tensor, const CaseSpec& c, int rank) const override {
    const LinearShape s = LinearShape::parse(c.shape);
    const DeviceMesh mesh(c.mesh);
    const Specs sp = specsFor(s);
    if (tensor == "output") return sp.output.box(tensor, s.output(), mesh, rank);
    if (tensor == "grad_input") return sp.input.box(tensor, s.input, mesh, rank);
    if (tensor == "grad_weight") return sp.weight.box(tensor, s.weight(), mesh, rank);
    if (tensor == "grad_bias") return sp.bias.box(tensor, {s.outFeatures}, mesh, rank);
    // Training: each parameter and its optimizer state as the parameter is laid out.
    if (tensor.rfind("param/weight", 0) == 0 || tensor.rfind("state/weight/", 0) == 0) {
      return sp.weight.box(tensor, s.weight(), mesh, rank);
    }
    if (tensor.rfind("param/bias", 0) == 0 || tensor.rfind("state/bias/", 0) == 0) {
      return sp.bias.box(tensor, {s.outFeatures}, mesh, rank);
    }
    TORCH_INTERNAL_ASSERT(false, "no layout for tensor ", tensor);
  }
  Box resultBoxOf(const std::string& tensor, const CaseSpec& c, int rank,
                  at::IntArrayRef fullShape) const override {
    if (harness::isWholeTrainingResult(tensor)) return Box::whole(fullShape);
    return resultBox(tensor, c, rank);
  }
  // Steps: each rank trains its weight and bias pieces with the loop the reference runs.
  bool trainsSteps() const override { return true; }

  // The box ColossalAI's strategy gives, from its name as displayed ("S0S1 = S0R x RS1_0"),
  // through its linear handler's logical-to-physical specs (spec_boxes.h), never through
  // specsFor: a layout that specsFor gets wrong for both the executor and resultBox shows here.
  std::optional<SpecifiedBox> specifiedBox(const std::string& tensor, const CaseSpec& c, int rank,
                                           at::IntArrayRef fullShape) const override {
    const auto inputDims = static_cast<int64_t>(LinearShape::parse(c.shape).input.size());
    const harness::ColossalLinearSequences seq =
        harness::colossalLinearSequences(displayName(), inputDims);
    // Each gradient has its operand's layout.
    const std::map<std::string, std::pair<const char*, const std::string*>> operands = {
        {"output", {"the output's", &seq.output}},
        {"grad_input", {"the input's", &seq.input}},
        {"grad_weight", {"the weight's", &seq.weight}},
        {"grad_bias", {"the bias's", &seq.bias}}};
    const auto it = operands.find(tensor);
    if (it == operands.end()) return std::nullopt;
    const auto& [operand, sequence] = it->second;
    return SpecifiedBox{
        harness::colossalSequenceBox(*sequence, fullShape, c.mesh, rank),
        "ColossalAI `" + displayName() + "` (" + tensor + ": " + operand + " " + *sequence + ")"};
  }

  // Memory judged exactly: the model replays the step's allocations (modelPeak), products'
  // scratch included, and predicts the tracker's peak to the byte in every float type, with
  // oneDNN on and off (LinearSharding.MeshStrategiesPredictTheirPeakInBFloat16WithOneDnnOnAndOff;
  // docs/sharding.md). Any byte off is a change in the step that the model no longer describes.
  PredictionTolerance predictionTolerance() const override {
    return PredictionTolerance::exactMemory();
  }

  // Each all-reduce on the group of the axes it reduces over.
  std::vector<std::pair<std::vector<int>, CommStats>> predictCommByGroup(const CaseSpec& c,
                                                                         int rank) const override {
    const LinearShape s = LinearShape::parse(c.shape);
    const DeviceMesh mesh(c.mesh);
    const Specs sp = specsFor(s);
    const int64_t es = c10::elementSize(c.dtype);
    std::vector<std::pair<std::vector<int>, CommStats>> out;
    // A collective over a group of one rank counts its call and no bytes.
    const auto allReduce = [&](const std::vector<int>& axes, int64_t numel) {
      CommStats st;
      st.add(Collective::kAllReduce, mesh.groupSize(axes) > 1 ? numel * es : 0);
      out.emplace_back(axes, st);
    };
    if (!spec_.inAxes.empty()) {
      allReduce(spec_.inAxes, sp.output.box("output", s.output(), mesh, rank).numel());
    }
    if (!spec_.outAxes.empty()) {
      allReduce(spec_.outAxes, sp.input.box("input", s.input, mesh, rank).numel());
    }
    if (!spec_.batchAxes.empty()) {
      allReduce(spec_.batchAxes, sp.weight.box("weight", s.weight(), mesh, rank).numel());
      if (s.bias)
        allReduce(spec_.batchAxes, sp.bias.box("bias", {s.outFeatures}, mesh, rank).numel());
    }
    addTrainingComm(out, c);  // steps: the loss and the norm each step, everything N times
    return out;
  }

  CommStats predictComm(const CaseSpec& c, int rank) const override {
    return totalComm(predictCommByGroup(c, rank));
  }
  // One node, the linear (singleNode): the output's all-reduce forward, the gradients' backward.
  std::optional<std::vector<harness::NodeComm>> predictCommByNode(const CaseSpec& c,
                                                                  int rank) const override {
    CaseSpec one = c;
    one.training = {};
    const auto parts = predictCommByGroup(one, rank);
    std::vector<harness::NodeComm> out = {{"linear", "forward", {}}, {"linear", "backward", {}}};
    for (size_t i = 0; i < parts.size(); ++i) {
      // The first part is the forward's where the input features are split (see above).
      const bool forward = i == 0 && !spec_.inAxes.empty();
      out[forward ? 0 : 1].comm += parts[i].second;
    }
    addTrainingComm(out, c);
    return out;
  }

  // The local matmuls: y = x W^T on the shards, then dx = dy W and dW = dy^T x, each
  // 2 x rows x in x out on the local extents.
  std::optional<double> predictFlops(const CaseSpec& c, int rank) const override {
    const LinearShape s = LinearShape::parse(c.shape);
    const DeviceMesh mesh(c.mesh);
    const Specs sp = specsFor(s);
    const double x = static_cast<double>(sp.input.box("input", s.input, mesh, rank).numel());
    const double out =
        static_cast<double>(sp.weight.box("weight", s.weight(), mesh, rank).length[0]);
    return 6 * x * out;
  }

 private:
  LinearMeshSpec spec_;
  int batchDim_;
  PlantedFault fault_;
};

}  // namespace

std::unique_ptr<harness::Strategy> makeLinearMeshStrategy(const LinearMeshSpec& spec, int batchDim,
                                                          PlantedFault fault,
                                                          const std::string& idPrefix) {
  std::string id = idPrefix + "sharding/linear/" + compactName(spec.name);
  std::string display = spec.name;
  if (batchDim >= 0) {
    id += "/" + std::to_string(batchDim);
    display += "_" + std::to_string(batchDim);
  }
  return std::make_unique<LinearMeshStrategy>(spec, batchDim, fault, id, display);
}

namespace {

// The physical batch dimensions enumerated for a batch split: inputs of up to 4 dimensions.
constexpr int kMaxBatchDims = 3;

std::vector<std::unique_ptr<harness::Strategy>> registerLinearMesh() {
  std::vector<std::unique_ptr<harness::Strategy>> out;
  for (const auto& spec : linearMeshSpecs()) {
    if (spec.batchAxes.empty()) {
      out.push_back(makeLinearMeshStrategy(spec, -1));
    } else {
      for (int d = 0; d < kMaxBatchDims; ++d) out.push_back(makeLinearMeshStrategy(spec, d));
    }
  }
  return out;
}

}  // namespace
}  // namespace sb::strategies

SB_REGISTER_STRATEGIES(sb::strategies::registerLinearMesh);
