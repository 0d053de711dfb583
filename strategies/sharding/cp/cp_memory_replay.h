// The replay behind cpStepPeak (cp_memory.h), shared by its two files: cp_memory.cpp (the
// layers, the step) and cp_memory_attention.cpp (the ring's and Ulysses' attention). Internal to
// strategies/sharding/cp/. What the sizes mean and where the model comes from: cp_memory.cpp.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "reference/autograd_facts.h"
#include "strategies/sharding/cp/cp_memory.h"

namespace sb::strategies::cp::replay {

using harness::Collective;

class Replay {
 public:
  Replay(const CpStepSizes& s, std::vector<CpMemoryEvent>* log) : s_(s), log_(log) {
    B = s.batch;
    Tl = s.seq / s.w;
    D = s.dModel;
    H = s.heads / s.tp;
    Da = D / s.tp;
    es = s.es;
    E = B * Tl * D * es;
    A = B * Tl * Da * es;
    U = B * Tl * 4 * Da * es;
    S = B * H * Tl * Tl * es;
    R = B * H * Tl * es;
    Rb = B * H * Tl;
    N = B * Tl * es;
    // Ulysses: this rank's heads over the whole sequence.
    Hl = H / s.w;
    Sf = B * Hl * s.seq * s.seq * es;
    fold = B > 1 && H > 1 && Tl > 1;
    headCopy = H > 1 && Tl > 1;
    // A double scalar in a float tensor's arithmetic is cast first; an integer one always.
    scalarCast = es == 8 ? 0 : es;
  }

  int64_t run();

 private:
  void a(int64_t bytes, const char* what) {
    cur_ += bytes;
    peak_ = std::max(peak_, cur_);
    if (log_ && bytes != 0) log_->push_back({bytes, what});
  }
  void f(int64_t bytes, const char* what) {
    cur_ -= bytes;
    if (log_ && bytes != 0) log_->push_back({-bytes, what});
  }
  void transient(int64_t bytes, const char* what) {
    a(bytes, what);
    f(bytes, what);
  }
  // x * (double scalar): the wrapped scalar, its cast, the result.
  void scaled(int64_t out, const char* what) {
    a(8, "scalar");
    a(scalarCast, "scalar cast");
    a(out, what);
    f(scalarCast, "scalar cast");
    f(8, "scalar");
  }
  // A batched product whose first operand is q-like (copied when it does not fold).
  void product(bool copiesFirst, int64_t copy, int64_t out, const char* what) {
    if (copiesFirst) a(copy, "matmul operand copy");
    a(out, what);
    if (copiesFirst) f(copy, "matmul operand copy");
  }
  void layerNorm(const char* what) {
    a(E, what);
    a(N, "layer norm mean");
    a(N, "layer norm rstd");
    if (!s_.training) {
      f(N, "layer norm rstd");
      f(N, "layer norm mean");
    }
  }
  // where(isneginf(x), zeros_like(x), x) of a row statistic: the online softmax's shift.
  void shift() {
    a(R, "zeros_like");
    a(Rb, "isneginf");
    a(R, "shift");
    f(Rb, "isneginf");
    f(R, "zeros_like");
  }
  void layerNormBackward() {
    a(E, "layer norm grad input");
    a(D * es, "layer norm grad weight");
    a(D * es, "layer norm grad bias");
    transient(2 * D * es, "layer norm backward buffer");
  }
  // A linear node's backward: the input's gradient and the parameters' temporaries.
  void linearBackward(int64_t gradIn, int64_t weight, int64_t bias) {
    a(gradIn, "linear grad input");
    a(weight, "linear grad weight");
    a(bias, "linear grad bias");
  }

  void ringForward();
  void ringBackward();
  void blockForward();
  void blockBackward();
  void ulyssesForward();
  void ulyssesBackward();
  // An autograd all-to-all of `bytes` (harness/comm/autograd_comm.h): its result, and in the
  // backward the gradient made contiguous first.
  void allToAll(int64_t bytes, const char* what);
  void layerForward(int64_t l);
  void ln1Backward(int64_t l);
  void ln2Backward(bool seedFreeable);
  void layerBackward(int64_t l, bool seedFreeable);
  // CP x TP (context_parallel.cpp's tensorParallelLayer).
  void tpLayerForward(int64_t l);
  void tpLayerBackward(int64_t l, bool seedFreeable);
  // An autograd all-reduce over the tensor-parallel ranks of an activation: its copy and the
  // backend's scratch.
  void tpAllReduce(const char* what) {
    a(E, what);
    transient(s_.tpScratch(Collective::kAllReduce, E, E), "all-reduce scratch");
  }
  // Two gradients of one tensor meet in autograd's input buffer, `second` arriving while
  // `first` waits (reference::autogradSumsGradientsInPlace). LibTorch 1.13 adds them into a new
  // tensor, `sum`, and lets both go (`first` only where the buffer held its only reference,
  // `firstFreeable`). 2.x adds `second` into `first` where the buffer holds its only reference
  // (`second` goes; nothing is allocated, and `sum`'s later free is `first`'s), and otherwise
  // adds them into a new tensor as 1.13 does.
  // `firstReusable`: 2.x's test (LibTorch's can_accumulate_inplace) can refuse a `first` that
  // only the buffer holds; where it does is read off the trace (memory_trace.py --model).
  void gradSum(int64_t bytes, const char* sum, const char* first, bool firstFreeable,
               const char* second, bool firstReusable = true) {
    if (sumsInPlace_ && firstFreeable && firstReusable) {
      f(bytes, second);
      return;
    }
    a(bytes, sum);
    f(bytes, second);
    if (firstFreeable) f(bytes, first);
  }
  // A slice's gradient made whole-size (zero-padded), then added into .grad and let go.
  void sliceGrad(int64_t slice, int64_t whole) {
    a(whole, "whole-size grad");
    f(slice, "slice grad");
    f(whole, "whole-size grad");
  }

  const CpStepSizes& s_;
  std::vector<CpMemoryEvent>* log_;
  const bool sumsInPlace_ = reference::autogradSumsGradientsInPlace();
  int64_t cur_ = 0, peak_ = 0;
  int64_t B, Tl, D, H, Da, es, E, A, U, S, R, Rb, N, Hl, Sf, scalarCast;
  bool fold, headCopy;
};

}  // namespace sb::strategies::cp::replay
