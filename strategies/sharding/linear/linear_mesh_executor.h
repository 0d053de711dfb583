// The sharded Linear's executor (linear_mesh_executor.cpp), for its strategy (linear_mesh.cpp):
// the step on a rank's shards and its memory model, which replays the step's allocations in the
// step's own order (modelPass beside pass()), so the two live in one file.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "harness/comm/comm.h"
#include "harness/measure/update_profile.h"
#include "harness/strategy.h"
#include "reference/training.h"
#include "strategies/sharding/linear/linear_strategies.h"

namespace sb::strategies::linear_mesh {

using harness::CaseSpec;
using harness::RankContext;
using harness::ShardingSpec;

// The physical sharding specs of one case.
struct Specs {
  ShardingSpec input, weight, bias, output;
};

class LinearMeshExecutor final : public harness::RankExecutor {
 public:
  // The strategy's spec, batch dimension and fault, and the case's physical specs.
  LinearMeshExecutor(const LinearMeshSpec& spec, int batchDim, PlantedFault fault, Specs specs,
                     const CaseSpec& c);
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

  LinearMeshSpec spec_;
  int batchDim_;
  PlantedFault fault_;
  Specs specs_;
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

}  // namespace sb::strategies::linear_mesh
