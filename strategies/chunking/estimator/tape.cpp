// The taped ops of the chunking estimator (tape.h), shared by the transformer's training replay
// and the pair stack's: what each allocates forward, what it saves, and what its backward
// allocates.

#include "strategies/chunking/estimator/tape.h"

#include <algorithm>

namespace sb::strategies::chunking::estimator {

// at::layer_norm over `rows` rows of `ch` channels. A strided input is copied inside the
// kernel, forward and backward alike, and saved as the view it is; mean and rstd are saved.
Val tapedLayerNorm(Tape& t, const Val& x, int64_t rows, int64_t ch, int64_t es, bool contig) {
  const int64_t bytes = rows * ch * es;
  const int copy = contig ? -1 : t.alloc(bytes);
  const Val y{t.slot(), t.alloc(bytes)};
  const int64_t st = rows * std::max<int64_t>(es, 4);  // float, double for double
  const int mean = t.alloc(st), rstd = t.alloc(st);
  t.unref(copy);
  t.node({y.slot}, {x.h, mean, rstd}, [&t, x, bytes, ch, es, contig](const std::vector<int>& g) {
    const int64_t copies = (contig ? 0 : bytes) + (t.strided(g[0]) ? bytes : 0);
    t.counter().alloc(copies);
    const int gx = t.alloc(bytes);
    t.paramGrad(ch * es);
    t.paramGrad(ch * es);
    t.counter().alloc(2 * ch * 4);  // the weight and bias gradients' float accumulators
    t.counter().release(2 * ch * 4);
    t.counter().release(copies);
    return std::vector<std::pair<int, int>>{{x.slot, gx}};
  });
  t.unref(mean);
  t.unref(rstd);
  return y;
}

// A view of x whose backward allocates a gradient of `gradBytes`: a slice (the gradient
// zero-padded to the full tensor) or a reshape of transposed heads (the strided gradient
// copied).
Val tapedView(Tape& t, const Val& x, int64_t gradBytes) {
  const Val v{t.slot(), x.h};
  t.ref(x.h);
  t.node({v.slot}, {}, [&t, x, gradBytes](const auto&) {
    return std::vector<std::pair<int, int>>{{x.slot, t.alloc(gradBytes)}};
  });
  return v;
}

// An elementwise op whose backward saves its input (gelu) or its output (sigmoid, relu).
Val tapedElementwise(Tape& t, const Val& x, bool savesOutput) {
  const int64_t b = t.bytes(x.h);
  const Val y{t.slot(), t.alloc(b)};
  t.node({y.slot}, {savesOutput ? y.h : x.h}, [&t, x, b](const auto&) {
    return std::vector<std::pair<int, int>>{{x.slot, t.alloc(b)}};
  });
  return y;
}

// a + b into `bytes`: nothing saved, the same gradient passed to both summands.
Val tapedAdd(Tape& t, const Val& a, const Val& b, int64_t bytes) {
  const Val y{t.slot(), t.alloc(bytes)};
  t.node({y.slot}, {}, [&t, a, b](const std::vector<int>& g) {
    t.ref(g[0]);
    t.ref(g[0]);
    return std::vector<std::pair<int, int>>{{a.slot, g[0]}, {b.slot, g[0]}};
  });
  return y;
}

// ChunkedRegion (chunk_runner.h) on the tape: the forward runs chunk by chunk without a tape
// (`forward(b, e)` replays one chunk's allocations on the counter and returns its part's
// bytes, still held, then copied into the preallocated output); the backward recomputes
// each chunk with a tape from leaves of the region's inputs (`taped(leaves, b, e)`) and
// backpropagates that chunk's gradient, a view of the region's (strided where `strided`).
// A leaf keeps its first chunk's gradient and adds the later ones in place.
Val tapedRegion(Tape& t, const std::vector<Val>& in, int64_t outBytes, int64_t extent,
                int64_t chunk, const std::function<int64_t(int64_t, int64_t)>& forward,
                const std::function<Val(const std::vector<Val>&, int64_t, int64_t)>& taped,
                const std::function<bool(int64_t, int64_t)>& strided) {
  const int64_t C = std::min(chunk, extent);
  const Val out{t.slot(), t.alloc(outBytes)};
  for (int64_t b = 0; b < extent; b += C) t.counter().release(forward(b, std::min(extent, b + C)));
  std::vector<int> saved;
  for (const auto& v : in) saved.push_back(v.h);
  t.node({out.slot}, saved, [&t, in, taped, strided, extent, C](const std::vector<int>& g) {
    std::vector<Val> leaves;
    for (const auto& v : in) {
      leaves.push_back(Val{t.slot(), v.h});
      t.leaf(leaves.back().slot);
    }
    std::map<int, int> grads;
    for (int64_t b = 0; b < extent; b += C) {
      const int64_t e = std::min(extent, b + C);
      const Val o = taped(leaves, b, e);
      std::map<int, int> chunkGrads = grads;
      chunkGrads[o.slot] = t.view(g[0], strided(b, e));
      t.backward(chunkGrads);
      grads.clear();
      for (const auto& l : leaves) {
        if (chunkGrads.count(l.slot)) grads[l.slot] = chunkGrads[l.slot];
      }
      t.unref(o.h);
    }
    std::vector<std::pair<int, int>> out;
    for (size_t i = 0; i < in.size(); ++i) {
      auto it = grads.find(leaves[i].slot);
      if (it != grads.end()) out.push_back({in[i].slot, it->second});
    }
    return out;
  });
  return out;
}

}  // namespace sb::strategies::chunking::estimator
