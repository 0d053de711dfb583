#pragma once

// The memory model of one Megatron block step (megatron_block.cpp): the step's allocations in
// order, recorded once, replayed at a case's sizes.

#include <cstdint>
#include <optional>
#include <string>

#include <c10/core/ScalarType.h>

#include "reference/block.h"

namespace sb::strategies {

// What the replay needs of one rank's step.
struct BlockStepSizes {
  std::string backend;  // the tensor-parallel group's: "threads", "gloo"
  bool sequenceParallel = false;
  bool twoD = false;                     // data parallel on axis 0 too
  int64_t tp = 1;                        // the tensor-parallel group's size
  int64_t batchLocal = 0, seqLocal = 0;  // this rank's activation box, [b, t_local, d]
  reference::BlockShape shape;
  at::ScalarType dtype = at::kFloat;
};

// The peak bytes of the step, from `start` bytes alive before it (which the first tokens
// partly release: the previous step's results). nullopt where no table was recorded for the
// backend, group size and mode, or the case takes other ATen paths than the recording (a dtype
// other than float32, dropout 0, a per-rank batch, sequence or head count of 1).
std::optional<int64_t> replayBlockStep(const BlockStepSizes& s, int64_t start);

}  // namespace sb::strategies
