// AutoChunk's search over chunk plans under a memory limit (estimator.h: searchChunkPlan), on
// the estimator's predictions. Its own file: it only calls estimateActivationPeak.

#include <algorithm>

#include "strategies/chunking/estimator.h"

namespace sb::strategies::chunking {

ChunkSearch searchChunkPlan(const reference::TransformerShape& shape, int64_t elementBytes,
                            int64_t maxMemory) {
  ChunkSearch out;
  out.unchunked = *estimateActivationPeak(shape, {"none", shape.seq}, elementBytes);
  out.smallest = out.unchunked;
  ++out.plansTried;
  if (out.unchunked <= maxMemory) {
    out.plan = ChunkPlan{"none", shape.seq};
    out.estimate = out.unchunked;
    return out;
  }
  for (const char* region : {"ffn", "attention", "block"}) {
    // From the whole sequence down: the first chunk that fits is the largest.
    for (int64_t c = shape.seq; c >= 1; --c) {
      const int64_t e = *estimateActivationPeak(shape, {region, c}, elementBytes);
      ++out.plansTried;
      out.smallest = std::min(out.smallest, e);
      if (e <= maxMemory) {
        if (!out.plan || c > out.plan->chunk) {
          out.plan = ChunkPlan{region, c};
          out.estimate = e;
        }
        break;
      }
    }
  }
  return out;
}

}  // namespace sb::strategies::chunking
