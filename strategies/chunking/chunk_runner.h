#pragma once

// What every chunked executor shares: running a region chunk by chunk into a preallocated
// output, the custom autograd function whose backward recomputes each chunk, and the step.

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "harness/error.h"
#include "harness/measure/memory.h"
#include "harness/measure/update_profile.h"
#include "harness/measure/verify.h"
#include "harness/strategy.h"
#include "reference/autograd_engine.h"
#include "reference/training.h"
#include "reference/transformer.h"

namespace sb::strategies::chunking {

// Planted faults, for tests: "off_by_one" leaves the last index of every chunk uncomputed,
// "wrong_offset" writes each chunk one index further than its place, "per_chunk_reduction"
// reduces over the chunked dimension within the chunk only.
enum class Fault { kNone, kOffByOne, kWrongOffset, kPerChunkReduction };

inline const char* faultName(Fault f) {
  switch (f) {
    case Fault::kNone:
      return "none";
    case Fault::kOffByOne:
      return "off_by_one";
    case Fault::kWrongOffset:
      return "wrong_offset";
    case Fault::kPerChunkReduction:
      return "per_chunk_reduction";
  }
  return "?";
}

// The fault named `name` among `allowed` (names as faultName gives them); nullopt otherwise.
inline std::optional<Fault> parseFault(const std::string& name,
                                       const std::vector<std::string>& allowed) {
  if (std::find(allowed.begin(), allowed.end(), name) == allowed.end()) return std::nullopt;
  for (Fault f : {Fault::kOffByOne, Fault::kWrongOffset, Fault::kPerChunkReduction}) {
    if (name == faultName(f)) return f;
  }
  return std::nullopt;
}

// An imported model (reference/torchscript): the chunkers run on the regions of the models they
// build (attention, feed-forward, block, the Evoformer's pair stack); finding such a region in
// an imported graph needs the dimension-flow analysis AutoChunk runs over an fx graph (which
// of a node's dimensions its output's rows follow, through views and reductions), which is
// not here yet. Said on the row, not silently not applicable.
inline harness::Applicability importedModelRefusal() {
  return harness::Applicability::unsupported(
      "chunking finds its regions in the transformer and Evoformer workloads it builds; an "
      "imported graph's attention and feed-forward regions are not searched for yet (no "
      "dimension-flow analysis over imported graphs)");
}

// Steps train: a case with steps whose shape is in inference mode (no backward) is refused.
inline std::optional<harness::Applicability> stepsRefusal(const harness::CaseSpec& c,
                                                          bool training) {
  if (!c.training.enabled() || training) return std::nullopt;
  return harness::Applicability::unsupported(
      "steps: " + std::to_string(c.training.steps) +
      " trains the model: its shape needs mode: training (inference has no backward)");
}

// Why a chunker of transformer regions cannot take the case at all (not a transformer
// workload; more than one rank), or nullopt when it can.
inline std::optional<harness::Applicability> transformerCaseRefusal(const harness::CaseSpec& c) {
  if (c.workload == "torchscript") return importedModelRefusal();
  if (c.workload != "gpt2_prefill" && c.workload != "vit_encoder") {
    return harness::Applicability::notApplicable("not a transformer workload");
  }
  if (c.meshSize() != 1) {
    return harness::Applicability::unsupported("chunking runs on one rank; the mesh has " +
                                               std::to_string(c.meshSize()));
  }
  return stepsRefusal(c, reference::TransformerShape::parse(c.shape, c.workload).training);
}

// params.chunk, where given: a positive integer, at most `length` (the chunked dimension's size,
// `what` naming it; < 0 where the case is of another workload), or InputError naming it. A chunk
// past the dimension was taken as the whole of it without a word. (Chunking checks its params
// on every case but an imported model's, which it does not chunk and whose params are other
// families' words: max_memory 0 is sharding/auto's "no limit".)
inline void checkChunkParam(const harness::CaseSpec& c, int64_t length, const std::string& what) {
  if (!c.params.contains("chunk")) return;
  const auto& v = c.params["chunk"];
  if (!v.is_number_integer() || v.get<int64_t>() <= 0) {
    throw harness::InputError("params.chunk must be a positive integer, got " + v.dump());
  }
  if (length >= 0 && v.get<int64_t>() > length) {
    throw harness::InputError("params.chunk " + v.dump() + " is longer than " + what + " (" +
                              std::to_string(length) + "): a chunk is at most " +
                              std::to_string(length) + ", the whole of it in one chunk");
  }
}

// checkChunkParam on a transformer workload's sequence.
inline void checkSequenceChunkParam(const harness::CaseSpec& c) {
  const bool transformer = c.workload == "gpt2_prefill" || c.workload == "vit_encoder";
  checkChunkParam(c, transformer ? reference::TransformerShape::parse(c.shape, c.workload).seq : -1,
                  "the sequence");
}

// Its chunk over the sequence: params.chunk (a quarter of the sequence where absent), at most
// the whole sequence.
inline int64_t sequenceChunkOf(const harness::CaseSpec& c) {
  const auto s = reference::TransformerShape::parse(c.shape, c.workload);
  const int64_t chunk = c.params.contains("chunk") ? c.params["chunk"].get<int64_t>()
                                                   : std::max<int64_t>(1, s.seq / 4);
  return std::min(chunk, s.seq);
}

// Over steps: a training tensor (loss, grad_norm, param/..., state/...) carries the rounding of
// the step's tensors it comes from (the loss: the output's; the rest: the gradients'),
// compounded over the steps; nullopt for a one-step tensor.
template <class OneStep>
std::optional<harness::Tolerance> trainingTolerance(const std::string& tensor,
                                                    const harness::CaseSpec& c,
                                                    const at::Tensor& expected,
                                                    const OneStep& oneStep) {
  const bool trained = tensor == "loss" || tensor == "grad_norm" ||
                       tensor.rfind("param/", 0) == 0 || tensor.rfind("state/", 0) == 0;
  if (!c.training.enabled() || !trained) return std::nullopt;
  return harness::overSteps(oneStep(tensor == "loss" ? "output" : "grad/"), c.dtype,
                            c.training.steps, expected);
}

// One chunk of a region: from the region's inputs (up to three tensors) and the index range
// [begin, end) of the chunked dimension, that range of the region's output.
using ChunkFn = std::function<at::Tensor(const std::vector<at::Tensor>&, int64_t, int64_t)>;

struct Chunking {
  int64_t seq = 0, chunk = 0;  // the chunked dimension's extent and the chunk size
  int64_t dim = 1;             // which dimension of the output is chunked
  Fault fault = Fault::kNone;

  // Runs `fn` chunk by chunk into a preallocated output.
  at::Tensor run(const ChunkFn& fn, const std::vector<at::Tensor>& in,
                 at::IntArrayRef outShape) const {
    at::Tensor out = at::empty(outShape, in.front().options().requires_grad(false));
    for (int64_t s = 0; s < seq; s += chunk) {
      int64_t e = std::min(seq, s + chunk);
      if (fault == Fault::kOffByOne && e - s > 1) --e;  // the chunk's last row is never computed
      const at::Tensor part = fn(in, s, e);
      int64_t at = s;
      if (fault == Fault::kWrongOffset) at = std::min(s + 1, seq - (e - s));
      out.narrow(dim, at, e - s).copy_(part);
    }
    return out;
  }
  int64_t chunks() const { return (seq + chunk - 1) / chunk; }
};

struct RegionContext {
  ChunkFn fn;
  Chunking chunking;
  std::vector<int64_t> outShape;
};

// The chunked region as one autograd node: forward without a tape, backward chunk by chunk
// with the chunk recomputed.
struct ChunkedRegion : public torch::autograd::Function<ChunkedRegion> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& a,
                            const at::Tensor& b, const at::Tensor& c, int64_t region) {
    ctx->saved_data["region"] = region;
    ctx->save_for_backward({a, b, c});
    const auto* r = reinterpret_cast<const RegionContext*>(region);
    return r->chunking.run(r->fn, {a, b, c}, r->outShape);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto* r = reinterpret_cast<const RegionContext*>(ctx->saved_data["region"].toInt());
    const auto saved = ctx->get_saved_variables();
    std::vector<at::Tensor> leaves;
    for (const auto& t : saved) {
      leaves.push_back(t.defined() ? t.detach().requires_grad_(true) : at::Tensor());
    }
    const int64_t T = r->chunking.seq, C = r->chunking.chunk;
    for (int64_t s = 0; s < T; s += C) {
      const int64_t e = std::min(T, s + C);
      at::AutoGradMode grad(true);
      const at::Tensor out = r->fn(leaves, s, e);
      reference::backward({out}, {grads[0].narrow(r->chunking.dim, s, e - s)});
    }
    torch::autograd::variable_list out;
    for (const auto& l : leaves) out.push_back(l.defined() ? l.grad() : at::Tensor());
    out.push_back(at::Tensor());
    return out;
  }
};

// The step of every chunked executor on its model (input(), target(), parameters(),
// zeroGrad()): the layers from the input, which requires grad in training, and there the
// backward of sum(output * target) into zeroed gradients. Records the activation peak, above
// what was alive when the step began (parameters, gradients, the input), beside the estimate
// that prepare() puts in `estimate_`. The runner resets the peak before the step it measures.
//
// A case with steps runs that step N times from the initial parameters, each followed by the
// reference's update (reference/training.h: the norm, clipping, LibTorch's optimizer), and
// predicts its peak as the estimate above the optimizer's state (from the second step on) or
// the update on the gradients, as harness::profileUpdate measures it.
template <class Model>
class ChunkedStepExecutor : public harness::RankExecutor {
 public:
  explicit ChunkedStepExecutor(bool training, reference::TrainingSpec steps = {})
      : training_(training), steps_(std::move(steps)) {}

  void step(harness::RankContext& ctx) override {
    if (steps_.enabled()) return train(ctx);
    const int64_t startLive = harness::MemoryTracker::instance().current(ctx.rank());
    pass();
    activationPeak_ = harness::MemoryTracker::instance().peak(ctx.rank()) - startLive;
    startLive_ = startLive;
  }

  std::map<std::string, at::Tensor> results() const override {
    if (!loop_) return results_;
    std::map<std::string, at::Tensor> out;  // written when asked, not inside the step's peak
    loop_->write(out);
    return out;
  }

  std::optional<int64_t> predictedPeakBytes() const override {
    if (!estimate_) return std::nullopt;
    if (!steps_.enabled()) return startLive_ + *estimate_;
    const int64_t state = steps_.steps > 1 ? update_.stateBytes : 0;
    return std::max(entryLive_, startLive_ + std::max(*estimate_ + state, update_.peak));
  }

 protected:
  // Every layer, from the step's input.
  virtual at::Tensor forward(const at::Tensor& input) = 0;

  // The record's mode, measured activation peak and estimate.
  std::vector<std::pair<std::string, std::string>> peakParams() const {
    return {{"mode", training_ ? "training" : "inference"},
            {"activation_peak_bytes", std::to_string(activationPeak_)},
            {"estimated_activation_peak_bytes",
             estimate_ ? std::to_string(*estimate_) : std::string("n/a")}};
  }

  std::unique_ptr<Model> model_;
  std::optional<int64_t> estimate_;  // of the activation peak, for the plan

 private:
  // The one step the estimate replays; the loss sum(output * target) in training.
  double pass() {
    if (training_) model_->zeroGrad();
    at::AutoGradMode grad(training_);
    const at::Tensor x0 = model_->input().detach().requires_grad_(training_);
    const at::Tensor x = forward(x0);
    results_.clear();
    results_["output"] = x.detach();
    double loss = 0;
    if (training_) {
      {
        // The product and the sum live until the backward returns (as the estimate has them).
        const at::Tensor product = x * model_->target();
        const at::Tensor sum = product.sum();
        reference::backward({sum});
        loss = sum.item<double>();
      }
      results_["grad_input"] = x0.grad();
      for (const auto& [n, p] : model_->parameters()) results_["grad/" + n] = p.grad();
    }
    return loss;
  }

  void train(harness::RankContext& ctx) {
    auto& mem = harness::MemoryTracker::instance();
    const int rank = ctx.rank();
    if (initial_.empty()) {  // the first step(): the runner's untimed warm-up
      for (const auto& [n, p] : model_->parameters()) initial_.push_back(p.detach().clone());
      model_->zeroGrad();
      update_ = harness::profileUpdate(rank, steps_, model_->parameters());
    }
    entryLive_ = mem.current(rank);
    loop_.reset();
    {
      at::NoGradGuard noGrad;
      const auto& params = model_->parameters();
      for (size_t i = 0; i < params.size(); ++i) params[i].second.copy_(initial_[i]);
    }
    loop_ = std::make_unique<reference::TrainingLoop>(steps_, model_->parameters());
    startLive_ = mem.current(rank);
    for (int k = 0; k < steps_.steps; ++k) loop_->update(pass());
  }

  bool training_;
  reference::TrainingSpec steps_;
  std::map<std::string, at::Tensor> results_;
  int64_t activationPeak_ = 0, startLive_ = 0, entryLive_ = 0;
  std::vector<at::Tensor> initial_;
  std::unique_ptr<reference::TrainingLoop> loop_;
  harness::UpdateProfile update_;
};

}  // namespace sb::strategies::chunking
