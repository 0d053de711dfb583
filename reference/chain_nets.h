#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "reference/workload.h"

namespace sb::reference {

// A network cut into a chain of stages, each mapping one tensor to one tensor: the form the
// checkpointing family schedules. Networks that are not plain sequences are cut where a single
// tensor crosses: a ResNet between residual blocks (the skip connection lives inside a stage),
// a DenseNet after each dense layer, whose stage maps the concatenated features x to
// cat(x, layer(x)).
//
// Parameters and buffers are plain tensors owned here; the loss of a step is
// sum(output * target), so that d(loss)/d(output) = target is a fixed, dense gradient.
class ChainNet {
 public:
  using StageFn = std::function<at::Tensor(const at::Tensor& x, bool updateBuffers)>;

  int numStages() const { return static_cast<int>(stages_.size()); }
  const std::string& stageName(int i) const { return stages_.at(i).first; }
  // Runs stage i. `updateBuffers` is false on a recomputation: running statistics are updated
  // once a step, as without checkpointing (batch norm still normalises with the batch's
  // statistics either way, so the output is the same).
  at::Tensor stage(int i, const at::Tensor& x, bool updateBuffers) const {
    return stages_.at(i).second(x, updateBuffers);
  }
  // Every stage in order, taped, buffers updated: the plain reference forward.
  at::Tensor forward(const at::Tensor& x) const;

  const std::vector<std::pair<std::string, at::Tensor>>& parameters() const { return params_; }
  const std::vector<std::pair<std::string, at::Tensor>>& buffers() const { return buffers_; }
  const at::Tensor& input() const { return input_; }
  const at::Tensor& target() const { return target_; }

  // Zeroed gradients for every parameter, allocated once: a step accumulates into them, as a
  // training loop with zero_grad() does, so that memory measurements of a step see no
  // gradient allocations and the checkpointed and plain runs add in the same order.
  void zeroGrad() const;
  // Running statistics back to their initial values: every step starts from the same state.
  void resetBuffers() const;

  // Used by the builders in chain_nets.cpp.
  at::Tensor param(const std::string& name, at::Tensor value);
  at::Tensor buffer(const std::string& name, at::Tensor value);
  void addStage(std::string name, StageFn fn) {
    stages_.emplace_back(std::move(name), std::move(fn));
  }
  void setData(at::Tensor input, at::Tensor target) {
    input_ = std::move(input);
    target_ = std::move(target);
  }

 private:
  std::vector<std::pair<std::string, StageFn>> stages_;
  std::vector<std::pair<std::string, at::Tensor>> params_, buffers_, initialBuffers_;
  at::Tensor input_, target_;
};

// The chain workloads: "mlp_chain", "resnet18", "densenet121", "gpt2_stack". Each builds the
// same parameters, buffers, input and target for the same shape, dtype and seed.
class ChainWorkload : public Workload {
 public:
  virtual std::unique_ptr<ChainNet> makeNet(const nlohmann::json& shape, at::ScalarType dtype,
                                            uint64_t seed) const = 0;
  // The plain reference: every stage taped, loss, backward. Expected tensors: "output",
  // "grad_input", "grad/<parameter>" for every parameter, and "buffer/<name>" for every
  // buffer after the step. Dropout draws from the default generator of the tensors' device,
  // seeded (every device's) by dropoutSeed(seed) at the start of the step; the state the step
  // leaves is expected too: "rng/cpu" (the CPU generator's get_state()) and, on a GPU,
  // "rng/cuda" (deviceGeneratorState).
  WorkloadData build(const nlohmann::json& shape, at::ScalarType dtype, uint64_t seed,
                     InputMode mode) const override;
  static uint64_t dropoutSeed(uint64_t seed) { return seed * 2654435761u + 17; }
};

// The state of a GPU's default generator (CUDA's Philox), which dropout on its tensors draws
// from: its seed and offset, read and set under the generator's lock. Needs LibTorch 2.1 or
// later (the offset), as the CUDA side does anyway; throws otherwise.
struct PhiloxState {
  uint64_t seed = 0, offset = 0;
};
PhiloxState devicePhiloxState(const at::Device& device);
void setDevicePhiloxState(const at::Device& device, const PhiloxState& state);
// The same as a CPU int64 tensor [seed, offset], as a step's results compare it ("rng/cuda").
at::Tensor deviceGeneratorState(const at::Device& device);

const ChainWorkload* findChainWorkload(const std::string& name);
std::vector<const Workload*> chainWorkloads();

}  // namespace sb::reference
