#pragma once

#include "reference/chain_nets.h"
#include "strategies/checkpointing/chain.h"

namespace sb::strategies::checkpointing {

// A stage's input as a taped forward (Fe_i) reads it: a leaf that takes its gradient where it is
// floating; ids (an imported transformer's tokens, which its first stage embeds) take none. The
// profiler and the executor's schedule runner read every stage's input through it.
at::Tensor tapeInput(const at::Tensor& x);

// Measures a network's chain on this thread's memory rank: sizes exactly, in bytes, from the
// tracking allocator's live-byte counts around each operation (x from the tensors, xbar as
// what a taped forward leaves alive, ftmp and btmp as the peaks above what the operation
// holds and writes); times in microseconds, the median of `repetitions` runs of each stage.
// Leaves the network as it found it: running statistics untouched (stages run with
// updateBuffers = false), the default generator's state restored, gradients zeroed.
// The tracking allocator must be installed (harness::MemoryTracker::install).
Chain profileChain(const reference::ChainNet& net, int rank, int repetitions = 3);

}  // namespace sb::strategies::checkpointing
