#pragma once

// What the update between two training steps holds, for executors that train over a case's
// steps (reference/training.h) and predict their peak: the optimizer's state and the
// temporaries of the norm, the clipping and LibTorch's optimizer are LibTorch's to allocate,
// so they are measured, as the checkpointing profiler measures a stage, not modelled.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "reference/training.h"

namespace sb::harness {

class Communicator;

struct UpdateProfile {
  // The most bytes the update holds above what was live before it, over a case's steps: the
  // first update's (which allocates the state) or a later one's (the state already there).
  int64_t peak = 0;
  int64_t stateBytes = 0;  // the optimizer's state after an update
};

// Runs the update of `spec` (twice where it has more than one step) on copies of `params`
// with gradients, under the memory tracker's bucket of `rank`. `counted`: as
// TrainingLoop::shareNorm, where the parameters are a rank's pieces (the norm's all-reduce is
// stood in for by its one float64 element: the backends reduce it in place).
UpdateProfile profileUpdate(int rank, const reference::TrainingSpec& spec,
                            const std::vector<std::pair<std::string, at::Tensor>>& params,
                            const std::vector<bool>& counted = {});

// The loop's norm summed over `comm`'s ranks: each adds the squares of the pieces `counted`
// marks (one holder of each replicated box), all-reduced in float64.
void shareNormOver(reference::TrainingLoop& loop, std::vector<bool> counted, Communicator& comm);

// The tensors a training case's every rank holds whole: each step's loss and gradient norm,
// and AdamW's step count.
bool isWholeTrainingResult(const std::string& tensor);

}  // namespace sb::harness
