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
// This file is the strategy and its executor together: the executor's memory model replays the
// step's allocations in the step's own order (modelPass beside pass()), and the two change
// together. The family's shared names (planted faults, the generator's list) are
// linear_specs.cpp.

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include "harness/comm/autograd_comm.h"
#include "harness/measure/memory.h"
#include "harness/measure/update_profile.h"
#include "harness/registry.h"
#include "reference/autograd_engine.h"
#include "reference/training.h"
#include "strategies/sharding/layout/spec_boxes.h"
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

// The physical sharding specs of one case.
struct Specs {
  ShardingSpec input, weight, bias, output;
};

class LinearMeshStrategy;

class LinearMeshExecutor final : public harness::RankExecutor {
 public:
  LinearMeshExecutor(const LinearMeshStrategy& s, const CaseSpec& c);
  void prepare(RankContext& ctx, const reference::WorkloadData& data) override;
  void step(RankContext& ctx) override;
  std::map<std::string, at::Tensor> results() const override;
  std::optional<int64_t> predictedPeakBytes() const override;

 private:
  // The forward and backward on the shards (gradients into x_, w_, b_): y.
  at::Tensor pass();
  // A case with steps: the loss sum(y * grad_output) over the ranks (each box of y once), the
  // global norm and LibTorch's optimizer over the weight and bias pieces (reference/training.h).
  void train(RankContext& ctx);
  // The pass's allocations replayed: the most it holds above what is live before it, and what
  // it leaves (y and the three gradients).
  struct PassModel {
    int64_t peak = 0, end = 0;
  };
  PassModel modelPass(RankContext& ctx) const;
  int64_t modelPeak(RankContext& ctx) const;
  int64_t modelTrainingPeak(RankContext& ctx) const;

  const LinearMeshStrategy& strategy_;
  const CaseSpec& case_;
  at::Tensor x_, w_, b_, gradOut_;
  harness::Communicator* inGroup_ = nullptr;
  harness::Communicator* outGroup_ = nullptr;
  harness::Communicator* batchGroup_ = nullptr;
  std::map<std::string, at::Tensor> results_;
  std::optional<int64_t> predicted_;
  // Training: the initial pieces each step() starts from, which pieces this rank counts in the
  // loss and the norm (one holder of each replicated box), the loop, and the memory it needs.
  at::Tensor initialW_, initialB_;
  bool outputCounted_ = true;
  std::vector<bool> paramCounted_;
  std::unique_ptr<reference::TrainingLoop> loop_;
  harness::UpdateProfile update_;
  int64_t entryLive_ = 0, startLive_ = 0;
  int64_t scratchForward_ = 0, scratchGradWeight_ = 0, scratchGradInput_ = 0;  // modelPeak
  bool fusedAddmm_ = false;
};

class LinearMeshStrategy final : public harness::Strategy {
 public:
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

  Specs specsFor(const LinearShape& s) const {
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
    return std::make_unique<LinearMeshExecutor>(*this, c);
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

LinearMeshExecutor::LinearMeshExecutor(const LinearMeshStrategy& s, const CaseSpec& c)
    : strategy_(s), case_(c) {}

void LinearMeshExecutor::prepare(RankContext& ctx, const reference::WorkloadData& data) {
  const LinearShape s = LinearShape::parse(case_.shape);
  const Specs sp = strategy_.specsFor(s);
  const auto& spec = strategy_.spec();
  Box xBox = sp.input.box("input", s.input, ctx.mesh(), ctx.rank());
  if (strategy_.fault() == PlantedFault::kShardOffsetOffByOne && strategy_.batchDim() >= 0) {
    const int d = strategy_.batchDim();
    xBox.offset[d] += xBox.offset[d] + xBox.length[d] < s.input[d] ? 1 : -1;
  }
  x_ = harness::sliceBox(data.inputs.at("input"), xBox).clone().set_requires_grad(true);
  w_ = harness::sliceBox(data.inputs.at("weight"),
                         sp.weight.box("weight", s.weight(), ctx.mesh(), ctx.rank()))
           .clone()
           .set_requires_grad(true);
  if (s.bias) {
    b_ = harness::sliceBox(data.inputs.at("bias"),
                           sp.bias.box("bias", {s.outFeatures}, ctx.mesh(), ctx.rank()))
             .clone()
             .set_requires_grad(true);
  }
  gradOut_ = harness::sliceBox(data.inputs.at("grad_output"),
                               sp.output.box("output", s.output(), ctx.mesh(), ctx.rank()))
                 .clone();
  if (!spec.inAxes.empty()) inGroup_ = &ctx.group(spec.inAxes);
  if (!spec.outAxes.empty()) outGroup_ = &ctx.group(spec.outAxes);
  if (!spec.batchAxes.empty()) batchGroup_ = &ctx.group(spec.batchAxes);
  // The products' scratch, on this CPU (matmul_scratch.h): the forward as the step calls it,
  // the backward's two with the layouts autograd's mm backward gives them, over the rows of the
  // flattened input.
  {
    const int64_t k = x_.size(-1), n = w_.size(0), rows = x_.numel() / std::max<int64_t>(k, 1);
    const bool fusedBias = b_.defined() && !inGroup_;
    // at::linear runs addmm for a 2-D input, or a contiguous 3-D one, with a bias; matmul
    // (mm on the flattened input) otherwise.
    fusedAddmm_ = fusedBias && (x_.dim() == 2 || (x_.dim() == 3 && x_.is_contiguous()));
    scratchForward_ = linearScratchBytes(x_.sizes(), w_.sizes(), fusedBias, case_.dtype);
    scratchGradWeight_ = matmulScratchBytes({n, rows}, true, {rows, k}, false, case_.dtype);
    scratchGradInput_ = matmulScratchBytes({rows, n}, false, {n, k}, false, case_.dtype);
  }
  if (!case_.training.enabled()) {
    predicted_ = modelPeak(ctx);
    return;
  }
  initialW_ = w_.detach().clone();
  if (b_.defined()) initialB_ = b_.detach().clone();
  // One holder of each replicated box counts: the one at coordinate 0 of every mesh axis that
  // does not split the tensor (the output is split by the batch and out_features axes, the
  // weight by the out_ and in_features ones, the bias by the out_features ones).
  const auto counted = [&](std::vector<std::vector<int>> splitting) {
    const auto coords = ctx.mesh().coords(ctx.rank());
    for (size_t a = 0; a < coords.size(); ++a) {
      const bool splits = std::any_of(splitting.begin(), splitting.end(), [&](const auto& axes) {
        return std::find(axes.begin(), axes.end(), static_cast<int>(a)) != axes.end();
      });
      if (!splits && coords[a] != 0) return false;
    }
    return true;
  };
  outputCounted_ = counted({spec.batchAxes, spec.outAxes});
  paramCounted_ = {counted({spec.outAxes, spec.inAxes})};
  std::vector<std::pair<std::string, at::Tensor>> params = {{"weight", w_}};
  if (b_.defined()) {
    paramCounted_.push_back(counted({spec.outAxes}));
    params.emplace_back("bias", b_);
  }
  update_ = harness::profileUpdate(ctx.rank(), case_.training, params, paramCounted_);
  predicted_ = modelTrainingPeak(ctx);
}

// The step's allocations replayed in order (the tracking allocator's counts, exactly):
//   the previous step's results, dropped first;
//   forward: y (one fused matmul with the bias); where the contraction is split, the partial
//   product, a copy of it all-reduced through the backend's scratch, and y = copy + b;
//   backward: the gradients of x, W and b (addmm's backward: x's, W's, then b's sum; where the
//   bias is added after the product: b's sum, then mm's backward, W's first), then each one
//   that is partial is all-reduced through a copy of it, which replaces it;
//   and each product's scratch (matmul_scratch.h: oneDNN's, in bfloat16 on AVX-512), held
//   while it runs, right after its result.
LinearMeshExecutor::PassModel LinearMeshExecutor::modelPass(RankContext& ctx) const {
  const int64_t X = x_.nbytes(), W = w_.nbytes(), B = b_.defined() ? b_.nbytes() : 0;
  const int64_t O = gradOut_.nbytes();
  const auto scratch = [&](harness::Communicator* g, int64_t bytes) {
    return g == nullptr || g->size() == 1
               ? 0
               : g->scratchBytes(harness::Collective::kAllReduce, bytes, bytes, case_.dtype);
  };
  int64_t current = 0, peak = 0;
  const auto alloc = [&](int64_t b) {
    current += b;
    peak = std::max(peak, current);
  };
  const auto transient = [&](int64_t b) {
    alloc(b);
    current -= b;
  };
  alloc(O);  // the (partial) product
  transient(scratchForward_);
  if (inGroup_ && strategy_.fault() != PlantedFault::kSkipForwardAllReduce) {
    alloc(O + scratch(inGroup_, O));      // its reduced copy, and the scratch
    current -= O + scratch(inGroup_, O);  // the scratch and the product go, the copy stays
    if (b_.defined()) {
      alloc(O);  // y = copy + b
      current -= O;
    }
  } else if (inGroup_ && b_.defined()) {
    alloc(O);
    current -= O;
  }
  // AddmmBackward0 computes mat1's gradient (x's) first, MmBackward0 mat2's (W's): the order
  // the traces show, which places each product's scratch.
  // Where the bias is added after the product (y + b), its gradient's sum comes first.
  if (fusedAddmm_) {
    alloc(X);
    transient(scratchGradInput_);
    alloc(W);
    transient(scratchGradWeight_);
    alloc(B);
  } else {
    alloc(B);
    alloc(W);
    transient(scratchGradWeight_);
    alloc(X);
    transient(scratchGradInput_);
  }
  // Each partial gradient's all-reduce: a copy of it and the scratch, the original then freed.
  if (outGroup_) alloc(X + scratch(outGroup_, X)), current -= X + scratch(outGroup_, X);
  if (batchGroup_) {
    alloc(W + scratch(batchGroup_, W)), current -= W + scratch(batchGroup_, W);
    if (b_.defined()) alloc(B + scratch(batchGroup_, B)), current -= B + scratch(batchGroup_, B);
  }
  return {peak, current};
}

// One step: the previous step's results (the output and the three gradients) dropped first,
// then the pass, above the shards and grad_output that stay.
int64_t LinearMeshExecutor::modelPeak(RankContext& ctx) const {
  const int64_t X = x_.nbytes(), W = w_.nbytes(), B = b_.defined() ? b_.nbytes() : 0;
  const int64_t O = gradOut_.nbytes();
  const int64_t base = X + W + B + O;
  return base + std::max(O + X + W + B, modelPass(ctx).peak);
}

// Over steps, above what is live once the step has let go of the last run's training: each
// step's pass (the optimizer's state alive from the second on), its loss (y times grad_output,
// summed, all-reduced), and the update between steps on the three gradients, as profileUpdate
// measured it.
int64_t LinearMeshExecutor::modelTrainingPeak(RankContext& ctx) const {
  const int64_t X = x_.nbytes(), W = w_.nbytes(), B = b_.defined() ? b_.nbytes() : 0;
  const int64_t O = gradOut_.nbytes(), es = static_cast<int64_t>(c10::elementSize(case_.dtype));
  auto& world = ctx.world();
  const int64_t lossScratch =
      world.size() > 1 ? world.scratchBytes(harness::Collective::kAllReduce, es, es, case_.dtype)
                       : 0;
  const PassModel pass = modelPass(ctx);
  int64_t peak = 0;
  for (int k = 0; k < std::min(case_.training.steps, 2); ++k) {
    const int64_t state = k == 0 ? 0 : update_.stateBytes;
    peak = std::max(peak, state + pass.peak);
    // The loss: y * grad_output (or, on a rank that does not count y, a zero), its sum, the
    // sum's all-reduce.
    const int64_t loss = outputCounted_ ? O + es : es;
    peak = std::max(peak, state + pass.end + loss);
    peak = std::max(peak, state + pass.end + es + lossScratch);
    peak = std::max(peak, X + W + B + update_.peak);
  }
  return peak;
}

at::Tensor LinearMeshExecutor::pass() {
  // dx is partial over the out_features axes: all-reduce it there in backward.
  at::Tensor x = outGroup_ ? harness::identityFwdAllReduceBwd(x_, *outGroup_) : x_;
  // dW and db are partial over the batch axes: all-reduce them there in backward.
  at::Tensor w = batchGroup_ ? harness::identityFwdAllReduceBwd(w_, *batchGroup_) : w_;
  at::Tensor b;
  if (b_.defined()) b = batchGroup_ ? harness::identityFwdAllReduceBwd(b_, *batchGroup_) : b_;
  at::Tensor y;
  if (inGroup_) {
    // y is partial over the in_features axes: all-reduce it there in forward, then add the
    // bias once.
    y = at::linear(x, w);
    if (strategy_.fault() != PlantedFault::kSkipForwardAllReduce) {
      y = harness::allReduceFwdIdentityBwd(y, *inGroup_);
    }
    if (b.defined()) y = y + b;
  } else {
    // Complete sums: the bias goes into the same fused kernel as the reference's, so that
    // 16-bit types round once, as the reference does.
    y = at::linear(x, w, b);
  }
  reference::backward({y}, {gradOut_});
  return y;
}

void LinearMeshExecutor::step(RankContext& ctx) {
  if (case_.training.enabled()) return train(ctx);
  // Drop the previous step's results first, so they do not count towards this step's peak.
  results_.clear();
  x_.mutable_grad().reset();
  w_.mutable_grad().reset();
  if (b_.defined()) b_.mutable_grad().reset();
  const at::Tensor y = pass();
  results_["output"] = y.detach();
  results_["grad_input"] = x_.grad();
  results_["grad_weight"] = w_.grad();
  if (b_.defined()) results_["grad_bias"] = b_.grad();
}

void LinearMeshExecutor::train(RankContext& ctx) {
  auto& mem = harness::MemoryTracker::instance();
  entryLive_ = mem.current(ctx.rank());
  // Every step() trains from the initial pieces with a new optimizer, the last one let go.
  loop_.reset();
  for (at::Tensor* t : {&x_, &w_, &b_}) {
    if (t->defined()) t->mutable_grad().reset();
  }
  {
    at::NoGradGuard noGrad;
    w_.copy_(initialW_);
    if (b_.defined()) b_.copy_(initialB_);
  }
  std::vector<std::pair<std::string, at::Tensor>> params = {{"weight", w_}};
  if (b_.defined()) params.emplace_back("bias", b_);
  loop_ = std::make_unique<reference::TrainingLoop>(case_.training, params);
  auto& world = ctx.world();
  if (world.size() > 1) harness::shareNormOver(*loop_, paramCounted_, world);
  startLive_ = mem.current(ctx.rank());
  for (int k = 0; k < case_.training.steps; ++k) {
    for (at::Tensor* t : {&x_, &w_, &b_}) {
      if (t->defined()) t->mutable_grad().reset();
    }
    double loss = 0;
    {
      // The backward is seeded with grad_output, d sum(y * grad_output) / dy, as the one-step
      // row's; the loss from y after it.
      const at::Tensor y = pass();
      at::Tensor total =
          outputCounted_ ? (y.detach() * gradOut_).sum() : at::zeros({}, y.options());
      world.allReduce(total);
      loss = total.item<double>();
    }
    loop_->update(loss);
  }
}

std::map<std::string, at::Tensor> LinearMeshExecutor::results() const {
  if (!loop_) return results_;
  // Written when asked, not inside the step's peak.
  std::map<std::string, at::Tensor> out;
  loop_->write(out);
  return out;
}

std::optional<int64_t> LinearMeshExecutor::predictedPeakBytes() const {
  if (!case_.training.enabled() || !predicted_) return predicted_;
  // Above what was live when the training began; at least what the last run's training left
  // when this step() was entered (its peak window opens there).
  return std::max(entryLive_, startLive_ + *predicted_);
}

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
