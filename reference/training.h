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

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
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
  // The learning-rate schedule (`schedule: {warmup_steps, decay, min_lr}`, torchtitan's):
  // update k (from 0) of N runs at lr * (k + 1) / (warmup_steps + 1) while k < warmup_steps,
  // then decays from lr to min_lr over the rest, p = (k - warmup_steps) / (N - warmup_steps):
  // none (lr), linear (min_lr + (lr - min_lr)(1 - p)), cosine (min_lr + (lr - min_lr)
  // (1 + cos(pi p)) / 2). No schedule: lr at every step.
  int warmupSteps = 0;
  std::string decay = "none";  // none | linear | cosine
  double minLr = 0;
  bool scheduled() const { return warmupSteps > 0 || decay != "none"; }
  // The learning rate of update `k` (from 0) of `steps`.
  double lrAt(int k, int steps) const;
  // {kind, lr, momentum, betas: [b1, b2], eps, weight_decay, clip_grad_norm, schedule}; throws
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

// The bookkeeping of one run of a case's steps over whole parameters (the reference, and an
// executor that trains on one rank): after each step's backward, update() records the loss and
// the gradient norm, clips and steps LibTorch's optimizer; write() hands back the tensors
// training's expected tensors name. Every executor that trains whole parameters uses this one
// loop, so that its numbers can differ from the reference's only by its forward and backward.
class TrainingLoop {
 public:
  TrainingLoop(const TrainingSpec& spec, std::vector<std::pair<std::string, at::Tensor>> params);
  ~TrainingLoop();
  // Records the loss, the norm, clips, sets the schedule's learning rate for this update and
  // steps the optimizer.
  void update(double loss);
  // Where the parameters are a rank's pieces of them: `counted` says whose squares this rank adds
  // to the norm (one holder of each box that several ranks replicate), `reduce` sums the ranks'
  // squares (an all-reduce, in float64). Every update() after this uses them.
  void shareNorm(std::vector<bool> counted, std::function<double(double)> reduce);
  // loss, grad_norm, param/<name>, state/<name>/<key>, state/step; their names appended to
  // `checked` where given, in that order.
  void write(std::map<std::string, at::Tensor>& out,
             std::vector<std::string>* checked = nullptr) const;
  // The bytes of the optimizer's state now (zero before the first update).
  int64_t stateBytes() const;

 private:
  TrainingSpec spec_;
  std::vector<std::pair<std::string, at::Tensor>> named_;
  std::vector<at::Tensor> params_;
  std::unique_ptr<torch::optim::Optimizer> opt_;
  std::vector<double> losses_, norms_;
  std::vector<bool> counted_;
  std::function<double(double)> reduce_;
};

// Whether `workload` has a training reference (buildTraining): the graph workloads, Megatron's
// transformer_block, the chain networks and imported models (torchscript) do.
bool hasTrainingReference(const std::string& workload);
// The workloads that have one, for messages: "mlp, gpt2, bert, mlp_chain, ...".
std::string trainingWorkloadList();

// The training reference (above) of a graph workload (mlp, gpt2, bert; dropout 0), of linear
// (its grad_output the target, the weight and bias stepped), of the chunking family's models
// (gpt2_prefill, vit_encoder, evoformer_pair in mode: training; inputs "input" and "target"), or
// of a
// chain network (reference/chain_nets.h: mlp_chain, resnet18, densenet121, gpt2_stack), or of an
// imported model (torchscript: the module's own forward and backward, reference/torchscript/
// import.h). Inputs:
// the graph's inputs and initial parameters, and "target". A chain network's step is its
// reference step (dropout from the generator seeded once before the first step, running
// statistics updated by every step), and its expected tensors add "buffer/<name>" and
// "rng/cpu" (the generator) as they stand after the last step; or of transformer_block
// (reference/block.h: its grad_output the target, its hashed dropout masks the same each step).
// Throws std::invalid_argument for another workload, naming those that have one.
WorkloadData buildTraining(const std::string& workload, const nlohmann::json& shape,
                           at::ScalarType dtype, uint64_t seed, InputMode mode,
                           const TrainingSpec& training);

}  // namespace sb::reference
