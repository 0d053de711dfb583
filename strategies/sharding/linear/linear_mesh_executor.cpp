// The sharded Linear's step on a rank's shards, its training over steps, and its memory model
// (linear_mesh_executor.h).

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include "harness/comm/autograd_comm.h"
#include "harness/comm/comm_site.h"
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

namespace sb::strategies::linear_mesh {

using harness::Box;
using reference::LinearShape;

LinearMeshExecutor::LinearMeshExecutor(const LinearMeshSpec& spec, int batchDim, PlantedFault fault,
                                       Specs specs, const CaseSpec& c)
    : spec_(spec), batchDim_(batchDim), fault_(fault), specs_(std::move(specs)), case_(c) {}

void LinearMeshExecutor::prepare(RankContext& ctx, const reference::WorkloadData& data) {
  const LinearShape s = LinearShape::parse(case_.shape);
  const Specs& sp = specs_;
  const auto& spec = spec_;
  Box xBox = sp.input.box("input", s.input, ctx.mesh(), ctx.rank());
  if (fault_ == PlantedFault::kShardOffsetOffByOne && batchDim_ >= 0) {
    const int d = batchDim_;
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
    // at::linear runs one addmm with a bias for a 2-D input and a contiguous 3-D one (1.13), or
    // any contiguous one (2.x), matmul and an add otherwise: asked of this LibTorch.
    fusedAddmm_ = fusedBias && (x_.dim() == 2 || (x_.is_contiguous() &&
                                                  linearRunsAddmm(x_.sizes(), w_.sizes(),
                                                                  case_.dtype)));
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
    return g == nullptr
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
  if (inGroup_ && fault_ != PlantedFault::kSkipForwardAllReduce) {
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
      world.scratchBytes(harness::Collective::kAllReduce, es, es, case_.dtype);
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
    if (fault_ != PlantedFault::kSkipForwardAllReduce) {
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
      {
        const harness::CommSiteScope site("", harness::StepPhase::kUpdate);
        world.allReduce(total);
      }
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

}  // namespace sb::strategies::linear_mesh
