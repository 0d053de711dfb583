// What the files of the chunking estimator (estimator.h) share: the byte counter every replay
// runs on, a transformer's sizes, and the inference replays of transformer_replay.cpp that the
// training replay (transformer_training.cpp) runs again inside its chunked regions. Internal to
// strategies/chunking/estimator/, in namespace `estimator`; what only one file uses stays in that
// file's anonymous namespace.
#pragma once

#include <algorithm>
#include <cstdint>

#include "strategies/chunking/estimator.h"

namespace sb::strategies::chunking::estimator {

class Counter {
 public:
  void alloc(int64_t bytes) {
    current_ += bytes;
    peak_ = std::max(peak_, current_);
  }
  void release(int64_t bytes) { current_ -= bytes; }
  int64_t peak() const { return peak_; }

 private:
  int64_t current_ = 0, peak_ = 0;
};

struct Sizes {
  int64_t B, T, D, H, es;
  bool causal;
  int64_t rows(int64_t n) const { return B * n * D * es; }  // [B, n, D]
  // A chunk of rows of [B, T, D] is contiguous only for one sequence or the whole sequence.
  bool contiguous(int64_t n) const { return B == 1 || n == T; }
};

// The inference replays (transformer_replay.cpp), each mirroring one function of
// reference/transformer.cpp, chunked_regions.cpp or the online-softmax walk: the allocations it
// makes on `m`, and the bytes it returns (still held) where it says so.
int64_t layerNorm(Counter& m, const Sizes& s, int64_t n, bool contiguous);
int64_t attention(Counter& m, const Sizes& s, int64_t n, int64_t keys, bool rowsContiguous);
int64_t ffn(Counter& m, const Sizes& s, int64_t n);
int64_t scaledQueries(Counter& m, const Sizes& s);
int64_t kernelAttention(Counter& m, const Sizes& s);
int64_t onlineAttention(Counter& m, const Sizes& s, int64_t chunk, bool keepLse = false);
int64_t blockChunk(Counter& m, const Sizes& s, int64_t n, int64_t keys, bool contiguous);

// The peak of one training step of the chunked executor (transformer_training.cpp).
int64_t trainingPeak(const Sizes& s, const ChunkPlan& plan, int64_t layers);

}  // namespace sb::strategies::chunking::estimator
