#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "reference/evoformer.h"
#include "reference/transformer.h"

namespace sb::strategies::chunking {

// Which region of every block is chunked, and by how many tokens; region "none" runs blocks
// unchunked (the plan of AutoChunk's search when nothing needs chunking).
struct ChunkPlan {
  // none | attention | ffn | block | ln_residual, or online (chunking/attention/online's CPU
  // walk over key blocks) | online/cuda (its CUDA kernel, whose blocking is its own)
  std::string region = "none";
  int64_t chunk = 0;
};

// The peak activation memory of a step under `plan`, in bytes above what is alive when the
// step starts (parameters, their gradients and the input), predicted node by node: every
// tensor the blocks' ATen calls allocate, in program order, live from its allocation to its
// last use, including the copies ATen makes where a view cannot be reshaped (a chunk of rows
// of a batch of more than one sequence). In training, also autograd's tape: the tensors each
// backward node saves, the backward's gradients in autograd's order (accumulated where they
// meet), parameter-gradient temporaries, and each chunk's recomputed tape. Modelled for
// float32 and float64; CPU kernels for bfloat16/float16 allocate float temporaries it does
// not model.
std::optional<int64_t> estimateActivationPeak(const reference::TransformerShape& shape,
                                              const ChunkPlan& plan, int64_t elementBytes);

// The same for the Evoformer-style pair stack chunked over rows (dim 1) or columns (dim 2) by
// `chunk` (the whole of n: unchunked), in inference and in training.
std::optional<int64_t> estimatePairActivationPeak(const reference::PairShape& shape, int dim,
                                                  int64_t chunk, int64_t elementBytes);

// AutoChunk's search under a memory limit (inference): no chunking when it fits; otherwise,
// for each region, the largest chunk whose estimate fits (the fewest chunks cost the least
// speed), and of those the plan with the largest chunk, ties going to the region that chunks
// the least code (ffn, then attention, then block). nullopt when no plan fits; `smallest`
// then holds the least any plan needs.
struct ChunkSearch {
  std::optional<ChunkPlan> plan;
  int64_t estimate = 0;   // of the plan
  int64_t unchunked = 0;  // the estimate without chunking
  int64_t smallest = 0;   // the least estimate of any plan tried
  int plansTried = 0;
};
ChunkSearch searchChunkPlan(const reference::TransformerShape& shape, int64_t elementBytes,
                            int64_t maxMemory);

}  // namespace sb::strategies::chunking
