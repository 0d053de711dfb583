// Flash-style attention: the keys chunked, with an online softmax.
//
//   chunking/attention/online  every block's attention core, softmax(q k^T / sqrt(d)) v, walks
//                              the keys `params.chunk` at a time, keeping per query row the
//                              running maximum, the running denominator and the unnormalised
//                              output, rescaled by exp(m_old - m_new) as a new block raises
//                              the maximum (FlashAttention's recurrence). The [seq, seq]
//                              scores never exist; a block's [seq, chunk] scores do.
//
// The walk is kernels::onlineSoftmaxAttention: on CUDA tensors kernels/attention.cu (64-query
// tiles, 64-key tiles through shared memory; its tile, not `chunk`, sets the blocking), on the
// CPU onlineSoftmaxAttentionCpu (ATen products per key block of `chunk`). Queries, keys,
// values and the output projection are the reference's own (Transformer::queries,
// keysValues, project), so only the softmax's arithmetic differs from the reference: the
// exponentials are summed block by block, in another order, and the output is compared with
// the tolerance of a sum split into as many parts as there are blocks (at least two: even one
// block sums exp(s - max) in another order than at::softmax).
//
// Training: the core is one autograd node, OnlineAttentionFn, whose backward walks the key
// blocks again (kernels::onlineSoftmaxAttentionBackward, ATen products on any device). Memory:
// the chunking estimator replays the walk (estimator/transformer_replay.cpp, onlineAttention; the
// kernel's dispatcher on CUDA tensors) and, in training, the node's saved tensors and its backward
// walk (TapedTransformer::onlineAttention), exact to the byte on the CPU in float32 and float64;
// half types are computed in float with temporaries it does not replay, and their rows carry
// no prediction (details.memory_model says so).
//
// Planted faults (tests only): "no_mask" forgets causality (every query sees every key),
// "wrong_scale" scales the scores by 1/d instead of 1/sqrt(d).

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>

#include "harness/measure/verify.h"
#include "harness/registry.h"
#include "kernels/attention.h"
#include "kernels/cuda_api.h"
#include "reference/transformer.h"
#include "strategies/chunking/chunk_runner.h"
#include "strategies/chunking/estimator.h"

namespace sb::strategies::chunking {
namespace {

using harness::Applicability;
using harness::CaseSpec;
using reference::Transformer;
using reference::TransformerShape;

class OnlineAttentionStrategy final : public harness::SingleRankStrategy {
 public:
  std::string singleNode(const harness::CaseSpec&) const override { return "attention"; }
  explicit OnlineAttentionStrategy(std::string fault = "")
      : SingleRankStrategy("chunking/attention/online",
                           "attention over key chunks with an online softmax (flash-style)",
                           harness::Family::kChunking),
        fault_(std::move(fault)) {}

  const std::string& fault() const { return fault_; }

  // Steps: the chunked step N times, the reference's update after each (chunk_runner.h).
  bool trainsSteps() const override { return true; }
  std::vector<std::string> caseParams() const override { return {"chunk"}; }
  // The estimator replays every allocation of the chunked step (estimator/).
  PredictionTolerance predictionTolerance() const override {
    return PredictionTolerance::exactMemory();
  }
  std::vector<std::pair<std::string, std::string>> params() const override {
    return {{"region", "attention"}, {"dim", "keys"}, {"case params", "chunk (keys a block)"}};
  }

  void checkParams(const CaseSpec& c) const override {
    if (c.workload != "torchscript") checkSequenceChunkParam(c);
  }

  Applicability applies(const CaseSpec& c) const override {
    if (auto refused = transformerCaseRefusal(c)) return *refused;
    const auto s = TransformerShape::parse(c.shape, c.workload);
    if (c.device == "cuda") {
      if (s.dModel / s.heads > kernels::cuda::kMaxAttentionHeadDim) {
        return Applicability::unsupported("the CUDA kernel takes head dims up to " +
                                          std::to_string(kernels::cuda::kMaxAttentionHeadDim) +
                                          ", the case has " + std::to_string(s.dModel / s.heads));
      }
      if (c.dtype != at::kFloat && c.dtype != at::kBFloat16) {
        return Applicability::unsupported("the CUDA kernel takes float32 or bfloat16");
      }
    }
    return Applicability::yes();
  }

  int64_t chunkOf(const CaseSpec& c) const { return sequenceChunkOf(c); }

  harness::Tolerance tolerance(const std::string& tensor, const CaseSpec& c,
                               const at::Tensor& expected) const override {
    if (auto t = trainingTolerance(tensor, c, expected, [&](const std::string& from) {
          return tolerance(from, c, expected);
        })) {
      return *t;
    }
    const auto s = TransformerShape::parse(c.shape, c.workload);
    const int64_t chunk = chunkOf(c);
    const int64_t parts = std::max<int64_t>(2, (s.seq + chunk - 1) / chunk);
    return harness::splitReductionTolerance(harness::Tolerance::defaultFor(c.dtype), c.dtype, s.seq,
                                            parts, expected);
  }

  std::unique_ptr<harness::RankExecutor> makeExecutor(const CaseSpec& c) const override;

  std::vector<std::string> plantableFaults() const override { return {"no_mask", "wrong_scale"}; }
  std::unique_ptr<harness::Strategy> withPlantedFault(const std::string& name) const override {
    const auto f = plantableFaults();
    if (std::find(f.begin(), f.end(), name) == f.end()) return nullptr;
    return std::make_unique<OnlineAttentionStrategy>(name);
  }

 private:
  std::string fault_;
};

// Training: the attention core as one autograd node. Forward: the walk (or the kernel) without a
// tape, saving q, k and v (views of the projections, which the projections' nodes hold anyway),
// the output and lse, O(T) per row, never a score matrix. Backward: the block walk of
// kernels::onlineSoftmaxAttentionBackward, which recomputes each block's probabilities.
struct OnlineAttentionFn : public torch::autograd::Function<OnlineAttentionFn> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q,
                            const at::Tensor& k, const at::Tensor& v, int64_t chunk, bool causal,
                            double scale) {
    kernels::AttentionResult r =
        kernels::onlineSoftmaxAttentionForTraining(q, k, v, chunk, causal, scale);
    ctx->save_for_backward({q, k, v, r.out, r.lse});
    ctx->saved_data["chunk"] = chunk;
    ctx->saved_data["causal"] = causal;
    ctx->saved_data["scale"] = scale;
    return r.out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const kernels::AttentionGrads g = kernels::onlineSoftmaxAttentionBackward(
        saved[0], saved[1], saved[2], saved[3], saved[4], grads[0],
        ctx->saved_data["chunk"].toInt(), ctx->saved_data["causal"].toBool(),
        ctx->saved_data["scale"].toDouble());
    return {g.dq, g.dk, g.dv, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

class OnlineAttentionExecutor final : public ChunkedStepExecutor<Transformer> {
 public:
  OnlineAttentionExecutor(const OnlineAttentionStrategy& s, const CaseSpec& c)
      : ChunkedStepExecutor(TransformerShape::parse(c.shape, c.workload).training, c.training),
        strategy_(s),
        case_(c),
        shape_(TransformerShape::parse(c.shape, c.workload)),
        chunk_(s.chunkOf(c)) {}

  void prepare(harness::RankContext&, const reference::WorkloadData&) override {
    model_ = std::make_unique<Transformer>(shape_, case_.dtype, case_.seed);
    // The kernel runs where it was built and a device is found; otherwise the ATen walk runs,
    // on whatever device the tensors are.
    kernel_ = reference::caseDevice().is_cuda() && kernels::cuda::available(nullptr);
    // The estimator replays float32 and float64 (as for the other regions): the CPU walk
    // computes half types in float, with temporaries it does not model.
    if (case_.dtype == at::kFloat || case_.dtype == at::kDouble) {
      estimate_ = estimateActivationPeak(shape_, {kernel_ ? "online/cuda" : "online", chunk_},
                                         c10::elementSize(case_.dtype));
    }
  }

  std::vector<std::pair<std::string, std::string>> recordParams() const override {
    std::vector<std::pair<std::string, std::string>> out = {
        {"region", "attention"},
        {"key_chunk", std::to_string(chunk_)},
        {"walk", kernel_ ? "kernels/attention.cu" : "onlineSoftmaxAttentionCpu"}};
    const auto peak = peakParams();
    out.insert(out.end(), peak.begin(), peak.end());
    return out;
  }

  nlohmann::json details() const override {
    if (estimate_) {
      return {{"memory_model",
               "the chunking estimator's replay of the walk (estimator/transformer_replay.cpp, "
               "onlineAttention)"}};
    }
    return {{"memory_model",
             "none for " + harness::dtypeName(case_.dtype) +
                 ": the walk computes half types in float, with temporaries the estimator does "
                 "not replay; the measured peak is recorded without a prediction"}};
  }

 protected:
  at::Tensor forward(const at::Tensor& input) override {
    const Transformer& m = *model_;
    const int64_t dh = shape_.dModel / shape_.heads;
    const std::string& fault = strategy_.fault();
    const double scale = fault == "wrong_scale" ? 1.0 / static_cast<double>(dh)
                                                : 1.0 / std::sqrt(static_cast<double>(dh));
    const bool causal = shape_.causal && fault != "no_mask";
    at::Tensor x = input;
    for (int l = 0; l < m.layers(); ++l) {
      const at::Tensor h = m.ln1(l, x);
      const auto [k, v] = m.keysValues(l, h);
      const at::Tensor q = m.queries(l, h);
      const at::Tensor heads =
          shape_.training ? OnlineAttentionFn::apply(q, k, v, chunk_, causal, scale)
                          : kernels::onlineSoftmaxAttention(q, k, v, chunk_, causal, scale).out;
      const at::Tensor y =
          heads.transpose(1, 2).reshape({heads.size(0), heads.size(2), shape_.dModel});
      const at::Tensor r = x + m.project(l, y);
      x = r + m.ffn(l, m.ln2(l, r));
    }
    return x;
  }

 private:
  const OnlineAttentionStrategy& strategy_;
  CaseSpec case_;
  TransformerShape shape_;
  int64_t chunk_;
  bool kernel_ = false;
};

std::unique_ptr<harness::RankExecutor> OnlineAttentionStrategy::makeExecutor(
    const CaseSpec& c) const {
  return std::make_unique<OnlineAttentionExecutor>(*this, c);
}

std::vector<std::unique_ptr<harness::Strategy>> registerOnlineAttention() {
  std::vector<std::unique_ptr<harness::Strategy>> out;
  out.push_back(std::make_unique<OnlineAttentionStrategy>());
  return out;
}

}  // namespace
}  // namespace sb::strategies::chunking

SB_REGISTER_STRATEGIES(sb::strategies::chunking::registerOnlineAttention);
