// An uneven column-parallel Linear: a strategy written outside stratbench, built against the
// installed package and loaded with `stratbench run --plugin` (docs/write-a-strategy.md
// walks through this file).
//
// Megatron's column-parallel Linear gives every rank the same number of output features. This
// one gives rank r a share of them proportional to `shares[r]` (a case parameter), as one
// would for ranks of unequal speed: with shares 3 : 1 rank 0 holds three quarters of the
// weight's rows. Rank r holds features [off_r, off_{r+1}) with off_r = floor(N * (s_0 + ... +
// s_{r-1}) / S), S the sum of the shares.
//
// Every rank holds the whole input X [rows, K]; rank r its rows W_r [N_r, K] of the weight
// and its part b_r of the bias.
//   forward:  Y_r = X W_r^T + b_r, the output's columns [off_r, off_{r+1}); no communication.
//   backward: dW_r = dY_r^T X and db_r = sum over rows of dY_r stay local; dX = sum over r of
//             dY_r W_r is a sum over ranks: one all-reduce of rows * K elements (Megatron's
//             "f" operator: identity forward, all-reduce backward).

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <numeric>

#include "harness/comm/autograd_comm.h"
#include "harness/plugin.h"
#include "harness/registry.h"
#include "reference/autograd_engine.h"

// The plugin's one SB_PLUGIN: its name, and the API version it is compiled against.
SB_PLUGIN("my_strategy");

namespace my_strategy {
namespace {

using sb::harness::Applicability;
using sb::harness::Box;
using sb::harness::CaseSpec;
using sb::harness::Collective;
using sb::harness::CommStats;
using sb::reference::LinearShape;

// The deliberate bug this strategy can be built with (`run --plant-fault ID=FAULT`): the input
// gradient is left as this rank's partial sum, never all-reduced.
constexpr const char* kSkipGradInputAllReduce = "skip_grad_input_all_reduce";

// The case's shares; rank r holds n - r parts by default. A malformed value is bad input
// (InputError names the key: `run` exits 2), whatever the case.
std::vector<int64_t> readShares(const CaseSpec& c) {
  const int64_t n = c.mesh.empty() ? 0 : c.mesh[0];
  std::vector<int64_t> shares;
  if (!c.params.contains("shares")) {
    for (int64_t r = 0; r < n; ++r) shares.push_back(n - r);
    return shares;
  }
  const auto& j = c.params["shares"];
  if (!j.is_array() || static_cast<int64_t>(j.size()) != n) {
    throw sb::harness::InputError("params.shares must be a list of " + std::to_string(n) +
                                  " positive integers, one per rank; got " + j.dump());
  }
  for (const auto& v : j) {
    if (!v.is_number_integer() || v.get<int64_t>() <= 0 || v.get<int64_t>() > 1000000) {
      throw sb::harness::InputError(
          "params.shares must hold positive integers (at most 1e6); got " + j.dump());
    }
    shares.push_back(v.get<int64_t>());
  }
  return shares;
}

// Feature offsets off_0 = 0 < ... < off_n = N.
std::vector<int64_t> offsets(int64_t features, const std::vector<int64_t>& shares) {
  const int64_t total = std::accumulate(shares.begin(), shares.end(), int64_t{0});
  std::vector<int64_t> off(shares.size() + 1, 0);
  int64_t cumulative = 0;
  for (size_t r = 0; r < shares.size(); ++r) {
    cumulative += shares[r];
    off[r + 1] = features * cumulative / total;
  }
  return off;
}

// The feature offsets of a case whose shares applies() has accepted.
std::vector<int64_t> featureOffsets(const CaseSpec& c) {
  return offsets(LinearShape::parse(c.shape).outFeatures, readShares(c));
}

class UnevenColwiseStrategy;

// One rank's executor: prepare() takes this rank's slices of the full tensors, step() runs one
// forward and backward, results() hands back what the layout (resultBox) says this rank holds.
class UnevenColwiseExecutor final : public sb::harness::RankExecutor {
 public:
  UnevenColwiseExecutor(const CaseSpec& c, bool planted) : case_(c), planted_(planted) {}

  void prepare(sb::harness::RankContext& ctx, const sb::reference::WorkloadData& data) override {
    world_ = &ctx.world();
    const auto s = LinearShape::parse(case_.shape);
    const auto off = featureOffsets(case_);
    const int64_t lo = off[ctx.rank()], hi = off[ctx.rank() + 1];
    // Copies, not views: a rank holds its own memory, as it would on its own device.
    x_ = data.inputs.at("input").reshape({s.rows(), s.inFeatures}).clone();
    w_ = data.inputs.at("weight").slice(0, lo, hi).clone();
    if (s.bias) b_ = data.inputs.at("bias").slice(0, lo, hi).clone();
    gradOut_ =
        data.inputs.at("grad_output").reshape({s.rows(), s.outFeatures}).slice(1, lo, hi).clone();
    inputShape_ = s.input;
    outputShape_ = s.output();
    outputShape_.back() = hi - lo;
    predictPeak();
  }

  void step(sb::harness::RankContext&) override {
    // Fresh leaves every step: gradients are recomputed, never accumulated across steps.
    at::Tensor x = x_.detach().requires_grad_(true);
    at::Tensor w = w_.detach().requires_grad_(true);
    at::Tensor b = b_.defined() ? b_.detach().requires_grad_(true) : at::Tensor();
    // Megatron's f: the forward uses X as it is; the backward all-reduces dX over the ranks.
    at::Tensor xIn = planted_ ? x : sb::harness::identityFwdAllReduceBwd(x, *world_);
    at::Tensor y = at::linear(xIn, w, b);
    // stratbench's backward, not torch::autograd::backward: on a GPU each rank of the threads
    // backend has its own autograd engine, without which ranks that all-reduce inside their
    // backward would wait for each other on LibTorch's one shared device thread.
    sb::reference::backward({y}, {gradOut_});
    results_ = {{"output", y.detach().reshape(outputShape_)},
                {"grad_input", x.grad().reshape(inputShape_)},
                {"grad_weight", w.grad()}};
    if (b.defined()) results_["grad_bias"] = b.grad();
  }

  std::map<std::string, at::Tensor> results() const override { return results_; }
  std::optional<int64_t> predictedPeakBytes() const override { return peak_; }

 private:
  // The peak of one step, in bytes of tensor storage as the harness's tracker counts them
  // (the harness's allocator hook), from what is live at its highest point, the input gradient's
  // all-reduce:
  //   - what prepare() took: X, W_r, b_r and dY_r;
  //   - the previous step's results, held until this step replaces them: Y_r, dX, dW_r, db_r;
  //   - this step's Y_r, dW_r and db_r, and dX three times: the matmul's dY_r W_r, the clone
  //     that identityFwdAllReduceBwd reduces in place, and the backend's scratch for the
  //     all-reduce (Communicator::scratchBytes: the threads backend sums into a copy).
  void predictPeak() {
    const int64_t x = x_.nbytes(), w = w_.nbytes(), y = gradOut_.nbytes();
    const int64_t b = b_.defined() ? b_.nbytes() : 0;
    const int64_t prepared = x + w + b + y;
    const int64_t results = y + x + w + b;
    const int64_t scratch = world_->scratchBytes(Collective::kAllReduce, x, x, case_.dtype);
    peak_ = prepared + results + (y + w + b + 2 * x) + scratch;
  }

  CaseSpec case_;
  bool planted_;
  sb::harness::Communicator* world_ = nullptr;
  at::Tensor x_, w_, b_, gradOut_;
  std::vector<int64_t> inputShape_, outputShape_;
  std::map<std::string, at::Tensor> results_;
  std::optional<int64_t> peak_;
};

class UnevenColwiseStrategy final : public sb::harness::Strategy {
 public:
  explicit UnevenColwiseStrategy(bool planted = false)
      : Strategy("mine/linear/uneven_colwise", "Uneven column-parallel Linear (shares per rank)",
                 sb::harness::Family::kSharding),
        planted_(planted) {}

  std::vector<std::pair<std::string, std::string>> params() const override {
    return {{"meshes", "1-D"}, {"case params", "shares (one positive integer per rank)"}};
  }
  // The case parameters it reads; `run` refuses a case whose params no strategy reads.
  std::vector<std::string> caseParams() const override { return {"shares"}; }

  // Its params checked before applies(), even where it cannot run the case: a malformed value
  // is the suite's mistake, never hidden behind an `unsupported` row.
  void checkParams(const CaseSpec& c) const override { readShares(c); }

  // Which cases it runs: linear workloads on 1-D meshes; `unsupported` (a row saying why) where
  // the shares leave a rank without features.
  Applicability applies(const CaseSpec& c) const override {
    if (c.workload != "linear") return Applicability::notApplicable("not a linear workload");
    if (c.mesh.size() != 1) return Applicability::notApplicable("needs a 1-D mesh");
    const auto off = offsets(LinearShape::parse(c.shape).outFeatures, readShares(c));
    for (size_t r = 0; r + 1 < off.size(); ++r) {
      if (off[r + 1] == off[r]) {
        return Applicability::unsupported("rank " + std::to_string(r) +
                                          " would hold no output features: give it a larger "
                                          "share or the layer more features");
      }
    }
    return Applicability::yes();
  }

  std::unique_ptr<sb::harness::RankExecutor> makeExecutor(const CaseSpec& c) const override {
    return std::make_unique<UnevenColwiseExecutor>(c, planted_);
  }

  // The layout: which box of each full tensor `rank` holds after a step. The harness slices
  // the reference with it and compares; it never asks the executor.
  Box resultBox(const std::string& tensor, const CaseSpec& c, int rank) const override {
    const auto s = LinearShape::parse(c.shape);
    const auto off = featureOffsets(c);
    const int64_t lo = off[rank], len = off[rank + 1] - off[rank];
    if (tensor == "grad_input") return Box::whole(s.input);  // all-reduced: every rank whole
    if (tensor == "grad_weight") return Box{{lo, 0}, {len, s.inFeatures}};
    if (tensor == "grad_bias") return Box{{lo}, {len}};
    // output: every leading dimension whole, the features' columns [lo, lo + len).
    Box box = Box::whole(s.output());
    box.offset.back() = lo;
    box.length.back() = len;
    return box;
  }

  // One all-reduce of dX per step, counted in bytes as nccl-tests count an all-reduce (the
  // buffer). The harness compares this with what the backend counted.
  CommStats predictComm(const CaseSpec& c, int) const override {
    const auto s = LinearShape::parse(c.shape);
    CommStats p;
    if (c.mesh[0] > 1) {
      p.add(Collective::kAllReduce, s.rows() * s.inFeatures * c10::elementSize(c.dtype));
    }
    return p;
  }

  // Three matmuls of rows x K x N_r each (forward, dX, dW), for the cost model.
  std::optional<double> predictFlops(const CaseSpec& c, int rank) const override {
    const auto s = LinearShape::parse(c.shape);
    const auto off = featureOffsets(c);
    return 6.0 * s.rows() * s.inFeatures * (off[rank + 1] - off[rank]);
  }

  // dX sums N features split over the ranks in another order than the reference's matmul:
  // the tolerance of a split reduction (harness/measure/verify.h). Exact inputs stay bitwise.
  sb::harness::Tolerance tolerance(const std::string& tensor, const CaseSpec& c,
                                   const at::Tensor& expected) const override {
    const auto base = Strategy::tolerance(tensor, c, expected);
    if (tensor != "grad_input") return base;
    const auto s = LinearShape::parse(c.shape);
    return sb::harness::splitReductionTolerance(base, c.dtype, s.outFeatures, c.mesh[0], expected);
  }

  std::vector<std::string> plantableFaults() const override { return {kSkipGradInputAllReduce}; }
  std::unique_ptr<Strategy> withPlantedFault(const std::string& fault) const override {
    if (fault != kSkipGradInputAllReduce) return nullptr;
    return std::make_unique<UnevenColwiseStrategy>(true);
  }

  // What the strategy should communicate, not what a planted fault does: a planted fault
  // then fails on the numbers and on the counted collectives.

 private:
  bool planted_;
};

std::vector<std::unique_ptr<sb::harness::Strategy>> registerStrategies() {
  std::vector<std::unique_ptr<sb::harness::Strategy>> out;
  out.push_back(std::make_unique<UnevenColwiseStrategy>());
  return out;
}

}  // namespace
}  // namespace my_strategy

// The same macro the built-in executors use: registered when the plugin is loaded.
SB_REGISTER_STRATEGIES(my_strategy::registerStrategies);
