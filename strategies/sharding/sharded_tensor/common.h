#pragma once

// What PyTorch ShardedTensor's column-wise and row-wise sharded Linear have in common: a 1-D
// group, a weight chunked along one dimension with chunk i on rank placements[i], and
// ShardedTensor's SPMD input convention, in which every rank brings its own batch (here: chunk
// r of the case's input along dimension 0) and gets its own rows of the output back.

#include <algorithm>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include "harness/comm/autograd_comm.h"
#include "harness/strategy.h"
#include "reference/autograd_engine.h"
#include "strategies/sharding/layout/spec_boxes.h"
#include "strategies/sharding/linear/linear_strategies.h"
#include "strategies/sharding/matmul_scratch.h"

namespace sb::strategies {

class ShardedTensorLinearStrategy : public harness::Strategy {
 public:
  std::string singleNode(const harness::CaseSpec&) const override { return "linear"; }
  // `weightDim`: 0 chunks the weight's rows (out_features), 1 its columns (in_features).
  ShardedTensorLinearStrategy(std::string kind, int weightDim, std::vector<int> placements,
                              PlantedFault fault, const std::string& idPrefix)
      : Strategy(idPrefix + "sharding/linear/sharded_tensor/" + kind +
                     (placements.empty() ? "" : "/placements=" + joined(placements)),
                 "ShardedTensor " + kind +
                     (placements.empty() ? "" : " placements=[" + joined(placements) + "]"),
                 harness::Family::kSharding),
        weightDim_(weightDim),
        placements_(std::move(placements)),
        fault_(fault) {}

  static std::string joined(const std::vector<int>& v) {
    std::string s;
    for (int x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
    return s;
  }

  PlantedFault fault() const { return fault_; }
  int weightDim() const { return weightDim_; }
  const std::vector<int>& explicitPlacements() const { return placements_; }

  // Only chunks placed out of rank order can be mistaken for rank order; any placements can be
  // rotated.
  std::vector<PlantedFault> supportedFaults() const {
    for (size_t i = 0; i < placements_.size(); ++i) {
      if (placements_[i] != static_cast<int>(i)) {
        return {PlantedFault::kIgnorePlacements, PlantedFault::kConsistentWrongLayout};
      }
    }
    return {PlantedFault::kConsistentWrongLayout};
  }
  std::vector<std::string> plantableFaults() const override {
    return plantedFaultNames(supportedFaults());
  }

  // Chunk i on rank placements(n)[i]; rank order where none were given. The executor and the
  // declared layout both place chunks by this, so the planted kConsistentWrongLayout (chunk i
  // on the rank of chunk i + 1) is wrong and consistent: only the layout check catches it.
  std::vector<int> placements(int n) const {
    std::vector<int> p(n);
    std::iota(p.begin(), p.end(), 0);
    if (!placements_.empty()) p = placements_;
    if (fault_ == PlantedFault::kConsistentWrongLayout) {
      std::rotate(p.begin(), p.begin() + (p.empty() ? 0 : 1), p.end());
    }
    return p;
  }

  std::vector<std::pair<std::string, std::string>> params() const override {
    return {{"weight_dim", std::to_string(weightDim_)},
            {"placements", placements_.empty() ? "rank order" : joined(placements_)},
            {"meshes", "1-D"}};
  }

  // Sharding sequences in ColossalAI's notation: the weight split over the mesh's one axis
  // ("S0"), the input and output split along dimension 0 (each rank's own batch).
  nlohmann::json sequences(size_t inputDims, bool bias) const {
    std::vector<std::string> io(inputDims, "R");
    io[0] = "S0";
    std::vector<std::string> w = {"R", "R"};
    w[weightDim_] = "S0";
    nlohmann::json j = {{"input", io}, {"weight", w}, {"output", io}};
    if (bias) j["bias"] = std::vector<std::string>{"R"};
    j["placements"] = placements_.empty() ? "rank order" : joined(placements_);
    return j;
  }

  nlohmann::json describe() const override {
    return {{"sharding_sequences", sequences(2, true)},
            {"sharding_sequences_for", "input [rows, in_features]"},
            {"communication", communication()}};
  }

  nlohmann::json caseDetails(const harness::CaseSpec& c) const override {
    const auto s = reference::LinearShape::parse(c.shape);
    return {{"sharding_sequences", sequences(s.input.size(), s.bias)},
            {"communication", communication()}};
  }

  virtual nlohmann::json communication() const = 0;

  harness::Applicability applies(const harness::CaseSpec& c) const override {
    using harness::Applicability;
    if (c.workload != "linear") return Applicability::notApplicable("not a linear workload");
    if (c.mesh.size() != 1) return Applicability::notApplicable("needs a 1-D mesh");
    const int n = static_cast<int>(c.mesh[0]);
    if (!placements_.empty() && static_cast<int>(placements_.size()) != n) {
      return Applicability::notApplicable("placements are for " +
                                          std::to_string(placements_.size()) + " ranks");
    }
    const auto s = reference::LinearShape::parse(c.shape);
    if (s.input[0] % n != 0) {
      return Applicability::unsupported(
          "input dimension 0 has size " + std::to_string(s.input[0]) +
          ", which does not split evenly over " + std::to_string(n) +
          " ranks: ShardedTensor gives every rank a batch of the same size");
    }
    return Applicability::yes();
  }

  // The sums split across ranks: for both, the bias gradient over the rows (each rank sums its
  // own, then all-reduce); colwise: the input gradient over out_features (reduce-scatter);
  // rowwise: the output over in_features (reduce-scatter).
  harness::Tolerance tolerance(const std::string& tensor, const harness::CaseSpec& c,
                               const at::Tensor& expected) const override {
    const auto s = reference::LinearShape::parse(c.shape);
    const harness::Tolerance base = Strategy::tolerance(tensor, c, expected);
    // Sums split over ranks, and sums whose local matmul has another shape than the reference's
    // (BLAS blocks by shape, so the same terms are added in another order): the weight's
    // gradient over the rows.
    int64_t length = 0;
    if (tensor == "grad_bias" || tensor == "grad_weight") length = s.rows();
    if (tensor == "grad_input" && weightDim_ == 0) length = s.outFeatures;
    if (tensor == "output" && weightDim_ == 1) length = s.inFeatures;
    int64_t parts = std::max<int64_t>(2, c.mesh[0]);
    if (length == 0 && tensor == "output" && expected.is_cuda()) {
      // Unsplit, but multiplied by a weight laid out in another order: cuBLAS may sum it in
      // another order (splitReductionTolerance says how much that may round).
      length = s.inFeatures;
      parts = 1;
    }
    if (length == 0 && tensor == "output" && weightDim_ == 0 && s.bias && !base.exact) {
      // Colwise adds the bias after the all-to-all, to a product already rounded to the dtype;
      // the reference's addmm adds it inside the product and rounds once. The extra rounding
      // is at most u |x w| <= u (|y| + |b|), and the workload draws |b| <= 1/sqrt(K) (nn.Linear's
      // bound). Below float32's atol; in bfloat16 a sum that cancels against the bias shows it.
      const double u = harness::unitRoundoff(c.dtype);
      const double scale = expected.numel() ? expected.abs().max().item<double>() : 0.0;
      const double atol = u * (scale + 1.0 / std::sqrt(static_cast<double>(s.inFeatures)));
      if (atol <= base.atol) return base;
      harness::Tolerance t = base;
      t.atol = atol;
      t.reason =
          "the product is rounded before the bias is added (the reference rounds once): "
          "atol = u (max|reference| + max|bias|)";
      return t;
    }
    if (length == 0) return base;
    return harness::splitReductionTolerance(base, c.dtype, length, parts, expected);
  }

  // Rows of the flattened [rows, features] view that each rank brings as its own batch.
  static int64_t localRows(const reference::LinearShape& s, int n) { return s.rows() / n; }

  // The boxes PyTorch's sharded Linear gives, from the strategy's name as displayed
  // ("ShardedTensor colwise placements=[2,0,3,1]"; none: rank order), never from placements():
  // the weight, and so its gradient, by ChunkShardingSpec(dim, placements), dim 0 for colwise
  // (the weight is [out_features, in_features]) and 1 for rowwise; the bias replicated, whole;
  // and, ShardedTensor's SPMD convention, each rank's own batch in and its own output rows back:
  // chunk r of the input and output along dimension 0 on rank r.
  std::optional<SpecifiedBox> specifiedBox(const std::string& tensor, const harness::CaseSpec& c,
                                           int rank, at::IntArrayRef fullShape) const override {
    const std::string& name = displayName();
    const std::string kind = name.rfind("ShardedTensor colwise", 0) == 0   ? "colwise"
                             : name.rfind("ShardedTensor rowwise", 0) == 0 ? "rowwise"
                                                                           : "";
    TORCH_CHECK(!kind.empty(), "`", name, "` names neither ShardedTensor colwise nor rowwise");
    const int64_t weightDim = kind == "colwise" ? 0 : 1;
    std::vector<int> rankOrder(c.mesh.at(0));
    std::iota(rankOrder.begin(), rankOrder.end(), 0);
    std::vector<int> chunkPlacements = rankOrder;
    if (const size_t at = name.find("placements=["); at != std::string::npos) {
      const auto spec = harness::parseChunkShardingSpec("(dim=" + std::to_string(weightDim) + ", " +
                                                        name.substr(at + 11) + ")");
      TORCH_CHECK(spec.has_value(), "`", name, "`: its placements are not a list of ranks");
      chunkPlacements = spec->placements;
    }
    if (tensor == "grad_weight") {
      std::string list;
      for (int p : chunkPlacements) list += (list.empty() ? "" : ", ") + std::to_string(p);
      return SpecifiedBox{harness::chunkSpecBox(weightDim, chunkPlacements, fullShape, rank),
                          "ShardedTensor " + kind + " (the weight's ChunkShardingSpec(dim=" +
                              std::to_string(weightDim) + ", placements=[" + list + "]))"};
    }
    if (tensor == "grad_bias") {
      return SpecifiedBox{harness::Box{std::vector<int64_t>(fullShape.size(), 0), fullShape.vec()},
                          "ShardedTensor " + kind + " (the bias replicated)"};
    }
    if (tensor == "output" || tensor == "grad_input") {
      return SpecifiedBox{harness::chunkSpecBox(0, rankOrder, fullShape, rank),
                          "ShardedTensor " + kind + " (" + tensor +
                              ": each rank's own batch, chunk r of dimension 0 on rank r)"};
    }
    return std::nullopt;
  }

  // Memory judged exactly: the recorded allocation sequence (memory.cpp), products' scratch
  // measured in prepare, predicts the tracker's peak to the byte in every float type, even and
  // uneven, placements reordered
  // (LinearSharding.ShardedTensorPassesWithItsPeakPredictedInEveryFloatType; docs/sharding.md).
  PredictionTolerance predictionTolerance() const override {
    return PredictionTolerance::exactMemory();
  }

  harness::Box resultBox(const std::string& tensor, const harness::CaseSpec& c,
                         int rank) const override {
    const auto s = reference::LinearShape::parse(c.shape);
    const int n = static_cast<int>(c.mesh[0]);
    if (tensor == "output") return harness::chunkBox(s.output(), 0, n, rank);
    if (tensor == "grad_input") return harness::chunkBox(s.input, 0, n, rank);
    if (tensor == "grad_bias") return harness::Box::whole({s.outFeatures});
    if (tensor == "grad_weight") {
      return harness::chunkBox(s.weight(), weightDim_, n,
                               harness::chunkOfRank(placements(n), rank));
    }
    TORCH_INTERNAL_ASSERT(false, "no layout for tensor ", tensor);
  }

 private:
  int weightDim_;
  std::vector<int> placements_;
  PlantedFault fault_;
};

// The peak bytes of one step of ShardedTensor's `kind` ("colwise", "rowwise") Linear from its
// recorded allocation sequence (sharded_tensor_memory.cpp), or nullopt where none was recorded
// for this backend, placement and number of ranks.
std::optional<int64_t> shardedTensorLinearPeak(const std::string& backend, const std::string& kind,
                                               bool reordered, int ranks,
                                               const std::map<std::string, int64_t>& size,
                                               int64_t base, int64_t results);

// What both executors hold and do alike: this rank's own batch flattened to [b, K], its chunk
// of the weight, the whole bias, its rows of grad_output, and the whole-group communicator.
class ShardedTensorExecutorBase : public harness::RankExecutor {
 public:
  ShardedTensorExecutorBase(const ShardedTensorLinearStrategy& s, const harness::CaseSpec& c)
      : strategy_(s), case_(c) {}
  std::map<std::string, at::Tensor> results() const override { return results_; }
  std::optional<int64_t> predictedPeakBytes() const override { return predicted_; }

 protected:
  // After prepare: the model's peak for this rank (with a bias, as recorded; any float type:
  // the sequence is the same, in its element size); `order` is the index that puts a
  // reordered placement's chunks in order, held from prepare on.
  void predictPeak(const std::string& kind, const at::Tensor& order) {
    const bool reordered = order.defined();
    if (!bias_.defined()) return;
    const auto s = reference::LinearShape::parse(case_.shape);
    const int64_t es = static_cast<int64_t>(c10::elementSize(case_.dtype));
    const int64_t K = s.inFeatures, N = s.outFeatures;
    const int64_t nc = kind == "colwise" ? w_.size(0) : 0;
    const int64_t kc = kind == "rowwise" ? w_.size(1) : 0;
    // The products' scratch, in the order the step runs them (colwise: w . all^T, then its
    // backward's grad^T . w and grad . all; rowwise: blocks . w^T, then grad^T . blocks and
    // grad . w), with the operands' layouts autograd's mm backward picks for them.
    const int64_t rows = n_ * b_;
    const auto dt = case_.dtype;
    const bool colwise = kind == "colwise";
    const int64_t forward = colwise ? matmulScratchBytes({nc, K}, false, {K, rows}, true, dt)
                                    : matmulScratchBytes({rows, kc}, false, {kc, N}, true, dt);
    const int64_t firstBackward = colwise
                                      ? matmulScratchBytes({rows, nc}, true, {nc, K}, false, dt)
                                      : matmulScratchBytes({N, rows}, true, {rows, kc}, false, dt);
    const int64_t secondBackward = colwise
                                       ? matmulScratchBytes({nc, rows}, false, {rows, K}, false, dt)
                                       : matmulScratchBytes({rows, N}, false, {N, kc}, false, dt);
    const std::map<std::string, int64_t> size = {
        {"X", x_.nbytes()},
        {"AG", n_ * b_ * K * es},
        {"W", w_.nbytes()},
        {"BIAS", bias_.nbytes()},
        {"Y", b_ * N * es},
        {"P", nc * n_ * b_ * es},
        {"PC", nc > 1 && n_ * b_ > 1 ? nc * n_ * b_ * es : 0},
        {"GOT", n_ * kc * b_ * es},
        {"GC", kc > 1 && n_ * b_ > 1 ? n_ * kc * b_ * es : 0},
        {"GT", kc == 1 && n_ * b_ > 1 ? n_ * kc * b_ * es : 0},
        {"PART", n_ * b_ * N * es},
        {"MMF", forward},
        {"MMA", firstBackward},
        {"MMB", secondBackward},
        {"S8", 8},
        {"S4", 4},
        {"ZERO", 0}};
    const int64_t base = x_.nbytes() + w_.nbytes() + bias_.nbytes() + gradOut_.nbytes() +
                         (reordered ? order.nbytes() : 0);
    const int64_t results = b_ * N * es + x_.nbytes() + w_.nbytes() + bias_.nbytes();
    predicted_ =
        shardedTensorLinearPeak(world_->backendName(), kind, reordered, n_, size, base, results);
  }

  void prepareCommon(harness::RankContext& ctx, const reference::WorkloadData& data) {
    const auto s = reference::LinearShape::parse(case_.shape);
    n_ = ctx.mesh().size();
    const int r = ctx.rank();
    b_ = ShardedTensorLinearStrategy::localRows(s, n_);
    place_ = strategy_.placements(n_);
    const int dim = strategy_.weightDim();
    const at::Tensor& weight = data.inputs.at("weight");
    const harness::Box wBox =
        harness::chunkBox(weight.sizes(), dim, n_, harness::chunkOfRank(place_, r));
    inputShape_ = harness::chunkBox(s.input, 0, n_, r).length;
    outputShape_ = harness::chunkBox(s.output(), 0, n_, r).length;
    x_ = harness::sliceBox(data.inputs.at("input"), harness::chunkBox(s.input, 0, n_, r))
             .reshape({b_, s.inFeatures})
             .clone()
             .set_requires_grad(true);
    w_ = harness::sliceBox(weight, wBox).clone().set_requires_grad(true);
    if (s.bias) bias_ = data.inputs.at("bias").clone().set_requires_grad(true);
    gradOut_ =
        harness::sliceBox(data.inputs.at("grad_output"), harness::chunkBox(s.output(), 0, n_, r))
            .clone();
    world_ = &ctx.world();
  }

  // Drops the last step's results and gradients, so that they neither accumulate nor count
  // towards this step's peak memory.
  void resetStep() {
    results_.clear();
    x_.mutable_grad().reset();
    w_.mutable_grad().reset();
    if (bias_.defined()) bias_.mutable_grad().reset();
  }

  // Adds the bias (replicated: its gradient, summed over this rank's rows only, is all-reduced
  // as DDP would), runs the backward from this rank's grad_output and keeps the results.
  void finishStep(at::Tensor y) {
    if (bias_.defined()) y = y + harness::identityFwdAllReduceBwd(bias_, *world_);
    y = y.reshape(outputShape_);
    reference::backward({y}, {gradOut_});
    results_["output"] = y.detach();
    results_["grad_input"] = x_.grad().reshape(inputShape_);
    results_["grad_weight"] = w_.grad();
    if (bias_.defined()) results_["grad_bias"] = bias_.grad();
  }

  const ShardedTensorLinearStrategy& strategy_;
  const harness::CaseSpec& case_;
  int n_ = 0;
  int64_t b_ = 0;
  std::vector<int> place_;
  std::vector<int64_t> inputShape_, outputShape_;
  at::Tensor x_, w_, bias_, gradOut_;
  harness::Communicator* world_ = nullptr;
  std::map<std::string, at::Tensor> results_;
  std::optional<int64_t> predicted_;
};

}  // namespace sb::strategies
