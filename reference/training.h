#pragma once

// Training over several optimizer steps: what a case with `steps: N` and `optimizer: {...}`
// runs and checks, beyond one forward and backward. The bugs of sharded training show across
// steps or in the state a step leaves (a gradient scaled twice, an optimizer stepping a stale
// copy of its shard), not in one step's gradients.
//
// The reference runs N steps on the whole batch with LibTorch's own optimizers
// (torch::optim::SGD, torch::optim::AdamW). A step: forward, the loss sum(output * target)
// (target: the workload's grad_output, so that d loss / d output = target), backward, the
// gradients' global 2-norm (in float64, over every parameter), clipping to clip_grad_norm
// where set (every gradient times min(1, max / (norm + 1e-6)), as
// torch.nn.utils.clip_grad_norm_), the optimizer's step. Every step sees the same batch.
//
// Expected tensors:
//   loss                     [N] float64: each step's loss, before its update
//   grad_norm                [N] float64: each step's gradient norm, before clipping
//   param/<name>             every parameter after the last step
//   state/<name>/<key>       the optimizer's state of every parameter after the last step:
//                            SGD with momentum: momentum_buffer; AdamW: exp_avg, exp_avg_sq
//   state/step               [1] float64: AdamW's step count (every parameter's is the same)

#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "reference/workload.h"

namespace torch::optim {
class Optimizer;
}

namespace sb::reference {

struct OptimizerSpec {
  std::string kind = "sgd";  // sgd | adamw
  double lr = 0.01;
  double momentum = 0;                            // sgd
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // adamw
  double weightDecay = 0;
  double clipGradNorm = 0;  // 0: no clipping
  // {kind, lr, momentum, betas: [b1, b2], eps, weight_decay, clip_grad_norm}; throws
  // std::invalid_argument naming `where` and the key on an unknown key or a bad value.
  static OptimizerSpec fromJson(const nlohmann::json& j, const std::string& where);
  nlohmann::json toJson() const;
  std::string toString() const;  // "adamw lr=0.001 betas=0.9,0.999 eps=1e-08 wd=0.01 clip=1"
};

struct TrainingSpec {
  int steps = 0;  // 0: one forward and backward, no optimizer (every case before `steps`)
  OptimizerSpec optimizer;
  bool enabled() const { return steps > 0; }
};

// LibTorch's optimizer of `spec` over `params` (whole tensors, or a rank's shards: every update
// is elementwise, so a shard's update is the whole tensor's on its elements, bitwise).
std::unique_ptr<torch::optim::Optimizer> makeOptimizer(const OptimizerSpec& spec,
                                                       const std::vector<at::Tensor>& params);
// The state the optimizer holds for `param`, by key (momentum_buffer; exp_avg, exp_avg_sq);
// empty before its first step. AdamW's step count: optimizerStep().
std::vector<std::pair<std::string, at::Tensor>> optimizerState(const torch::optim::Optimizer& opt,
                                                               const at::Tensor& param);
double optimizerStep(const torch::optim::Optimizer& opt, const at::Tensor& param);
// The state keys an optimizer of `spec` keeps per parameter.
std::vector<std::string> optimizerStateKeys(const OptimizerSpec& spec);

// The sum of the squares of `params`' gradients, in float64 (those without one skipped): the
// square of the gradient norm, or a shard's part of it.
double gradientSquares(const std::vector<at::Tensor>& params);
// Clipping as clip_grad_norm_: every gradient times min(1, maxNorm / (norm + 1e-6)) where that
// is below 1; nothing where maxNorm is 0 (no clipping).
void clipGradients(const std::vector<at::Tensor>& params, double norm, double maxNorm);

// Whether `workload` has a training reference (buildTraining); the graph workloads do.
bool hasTrainingReference(const std::string& workload);

// The training reference (above) of a graph workload (mlp, gpt2, bert; dropout 0). Inputs:
// the graph's inputs and initial parameters, and "target". Throws std::invalid_argument for
// another workload, naming those that have one.
WorkloadData buildTraining(const std::string& workload, const nlohmann::json& shape,
                           at::ScalarType dtype, uint64_t seed, InputMode mode,
                           const TrainingSpec& training);

}  // namespace sb::reference
