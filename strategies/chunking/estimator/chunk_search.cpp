// AutoChunk's search over chunk plans under a memory limit (estimator.h: searchChunkPlan), on
// the estimator's predictions. Its own file: it only calls estimateActivationPeak.

#include <algorithm>
#include <string>

#include "harness/error.h"
#include "strategies/chunking/estimator.h"

namespace sb::strategies::chunking {
namespace {

// The longest sequence searched: the search tries every chunk length of each region, so its
// work grows with seq; 2^20 tokens is three million estimates, a few seconds.
constexpr int64_t kMaxSearchSeq = int64_t{1} << 20;

// The estimator sums int64 byte counts of tensors as large as the attention scores
// (batch x heads x seq x seq elements): refused while their sum is far from overflowing, so that
// an estimate that wrapped can never read as one that fits.
void checkSizes(const reference::TransformerShape& s, int64_t elementBytes) {
  if (s.seq > kMaxSearchSeq) {
    throw harness::InputError("shape key 'seq' " + std::to_string(s.seq) +
                              ": the chunk search takes sequences of at most " +
                              std::to_string(kMaxSearchSeq) + " tokens");
  }
  const long double e = static_cast<long double>(elementBytes);
  const long double scores = e * s.batch * s.heads * s.seq * s.seq;
  const long double hidden = e * s.batch * s.seq * 4 * s.dModel;
  const long double perLayer = scores + hidden;
  const long double limit = static_cast<long double>(int64_t{1} << 62) / 64;
  if (perLayer * std::max<int64_t>(s.layers, 1) > limit) {
    throw harness::InputError("shape " + s.toString() +
                              ": its activations would exceed 2^56 bytes, past what the " +
                              "estimator counts exactly; choose a smaller shape");
  }
}

}  // namespace

ChunkSearch searchChunkPlan(const reference::TransformerShape& shape, int64_t elementBytes,
                            int64_t maxMemory) {
  checkSizes(shape, elementBytes);
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
