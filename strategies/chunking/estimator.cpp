// The node-by-node memory estimator of the chunking family (estimator.h). Each function below
// mirrors one function of reference/transformer.cpp or chunked_regions.cpp and replays its
// allocations on a counter: alloc when a tensor is made, release when its last holder goes.

#include "strategies/chunking/estimator.h"

#include <algorithm>

#include <c10/util/Exception.h>

namespace sb::strategies::chunking {
namespace {

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
};

// at::layer_norm of `n` rows: a contiguous copy of a strided input, the output, and the mean
// and inverse deviation it returns (float, B * n each) and the caller drops.
int64_t layerNorm(Counter& m, const Sizes& s, int64_t n, bool contiguous) {
  const int64_t copy = contiguous ? 0 : s.rows(n);
  m.alloc(copy);
  m.alloc(s.rows(n));
  m.alloc(2 * s.B * n * 4);
  m.release(2 * s.B * n * 4);
  m.release(copy);
  return s.rows(n);
}

// at::linear on [B, n, in] rows: ATen folds the batch into the rows, copying a strided input.
void linear(Counter& m, const Sizes& s, int64_t n, int64_t in, int64_t out, bool contiguous) {
  const int64_t copy = contiguous ? 0 : s.B * n * in * s.es;
  m.alloc(copy);
  m.alloc(s.B * n * out * s.es);
  m.release(copy);
}

// Transformer::attention for `n` query rows and `keys` keys; returns the output's bytes, which
// stay allocated.
int64_t attention(Counter& m, const Sizes& s, int64_t n, int64_t keys, bool rowsContiguous) {
  const int64_t En = s.rows(n), Ek = s.rows(keys);
  const int64_t scores = s.B * s.H * n * keys * s.es;
  // Folding [B, H] for the batched matmuls copies the strided head views when B > 1.
  const bool foldCopies = s.B > 1;
  linear(m, s, n, s.D, s.D, rowsContiguous);  // q
  const int64_t q = En;
  if (foldCopies) m.alloc(En + Ek);  // q and k^T made contiguous
  m.alloc(scores);                   // q k^T
  if (foldCopies) m.release(En + Ek);
  m.alloc(scores);  // / sqrt(d_head)
  m.release(scores);
  if (s.causal) {
    const int64_t mask = n * keys + (n + keys) * 8;  // bool mask and the two position aranges
    m.alloc(mask);
    m.alloc(scores);  // masked_fill
    m.release(mask);
    m.release(scores);
  }
  m.alloc(scores);  // softmax
  m.release(scores);
  if (foldCopies) m.alloc(Ek);  // v made contiguous
  m.alloc(En);                  // att v
  if (foldCopies) m.release(Ek);
  m.alloc(En);  // transpose + reshape copies
  m.release(En);
  linear(m, s, n, s.D, s.D, true);  // output projection
  m.release(En);                    // the reshaped heads
  m.release(scores + q);            // locals att and q at return
  return En;
}

// Transformer::ffn on `n` contiguous rows; returns the output's bytes. One C++ expression:
// its temporaries (the first linear's output, GELU's) live until it ends.
int64_t ffn(Counter& m, const Sizes& s, int64_t n) {
  linear(m, s, n, s.D, 4 * s.D, true);
  m.alloc(4 * s.rows(n));  // gelu
  linear(m, s, n, 4 * s.D, s.D, true);
  m.release(8 * s.rows(n));
  return s.rows(n);
}

int64_t keyEnd(const Sizes& s, int64_t end) { return s.causal ? end : s.T; }

// One block as ChunkedExecutor::layer runs it; the block's output stays allocated.
void block(Counter& m, const Sizes& s, const ChunkPlan& plan) {
  // Unchunked is the attention region in one chunk: the executor runs it so.
  const ChunkPlan p = plan.region == "none" ? ChunkPlan{"attention", s.T} : plan;
  const int64_t E = s.rows(s.T);
  const int64_t C = std::min(p.chunk, s.T);
  // A chunk of rows of [B, T, D] is contiguous only for one sequence or the whole sequence.
  const auto contiguous = [&](int64_t n) { return s.B == 1 || n == s.T; };
  const auto chunks = [&](const auto& fn) {
    for (int64_t b = 0; b < s.T; b += C) fn(b, std::min(s.T, b + C));
  };
  if (p.region == "attention" || p.region == "ffn") {
    const int64_t h = layerNorm(m, s, s.T, true);
    linear(m, s, s.T, s.D, 2 * s.D, true);  // keys and values
    int64_t a;
    if (p.region == "attention") {
      m.alloc(E);  // the preallocated output
      chunks([&](int64_t b, int64_t e) {
        const int64_t part = attention(m, s, e - b, keyEnd(s, e), contiguous(e - b));
        m.release(part);  // copied into place
      });
      a = E;
    } else {
      a = attention(m, s, s.T, s.T, true);
    }
    m.alloc(E);  // r = x + a
    m.release(a);
    int64_t f;
    if (p.region == "ffn") {
      m.alloc(E);
      chunks([&](int64_t b, int64_t e) {
        const int64_t n = e - b;
        const int64_t l2 = layerNorm(m, s, n, contiguous(n));
        const int64_t part = ffn(m, s, n);
        m.release(part);
        m.release(l2);
      });
      f = E;
      m.alloc(E);  // r + f
      m.release(f);
    } else {
      const int64_t l2 = layerNorm(m, s, s.T, true);
      f = ffn(m, s, s.T);
      m.alloc(E);  // r + f
      m.release(f);
      m.release(l2);
    }
    m.release(E + h + 2 * E);  // r, h, keys and values at return
    return;
  }
  if (p.region == "ln_residual") {
    // Four token-wise regions, each into its own preallocated output; attention and the
    // feed-forward block whole, between them.
    const auto tokenwise = [&](bool norm) {
      m.alloc(E);
      chunks([&](int64_t b, int64_t e) {
        const int64_t n = e - b;
        const int64_t part = norm ? layerNorm(m, s, n, contiguous(n)) : s.rows(n);
        if (!norm) m.alloc(part);  // the sum of two chunks of rows
        m.release(part);
      });
      return E;
    };
    const int64_t h = tokenwise(true);
    linear(m, s, s.T, s.D, 2 * s.D, true);  // keys and values
    const int64_t a = attention(m, s, s.T, s.T, true);
    const int64_t r = tokenwise(false);
    const int64_t h2 = tokenwise(true);
    const int64_t f = ffn(m, s, s.T);
    tokenwise(false);  // the block's output
    m.release(h + 2 * E + a + r + h2 + f);
    return;
  }
  // block: keys and values from LN1 of every token, then every chunk the whole block.
  const int64_t h = layerNorm(m, s, s.T, true);
  linear(m, s, s.T, s.D, 2 * s.D, true);
  m.release(h);
  m.alloc(E);
  chunks([&](int64_t b, int64_t e) {
    const int64_t n = e - b;
    const int64_t l1 = layerNorm(m, s, n, contiguous(n));
    const int64_t a = attention(m, s, n, keyEnd(s, e), true);
    m.alloc(s.rows(n));  // rs = xs + a
    m.release(a + l1);
    const int64_t l2 = layerNorm(m, s, n, true);
    const int64_t f = ffn(m, s, n);
    m.alloc(s.rows(n));  // rs + f
    m.release(f + l2);
    m.release(s.rows(n));  // rs
    m.release(s.rows(n));  // copied into place
  });
  m.release(2 * E);  // keys and values at return
}

}  // namespace

std::optional<int64_t> estimateActivationPeak(const reference::TransformerShape& shape,
                                              const ChunkPlan& plan, int64_t elementBytes) {
  if (shape.training) return std::nullopt;
  const Sizes s{shape.batch, shape.seq, shape.dModel, shape.heads, elementBytes, shape.causal};
  Counter m;
  const int64_t E = s.rows(s.T);
  for (int64_t l = 0; l < shape.layers; ++l) {
    block(m, s, plan);        // leaves the block's output allocated
    if (l > 0) m.release(E);  // the previous block's output, the input of this one
  }
  return m.peak();
}

std::optional<int64_t> estimatePairActivationPeak(const reference::PairShape& shape, int dim,
                                                  int64_t chunk, int64_t elementBytes) {
  if (shape.training) return std::nullopt;
  const int64_t B = shape.batch, N = shape.n, C = shape.c, H = shape.hidden, es = elementBytes;
  const int64_t Ez = B * N * N * C * es;
  const int64_t step = std::min(chunk, N);
  Counter m;
  // A chunk of dimension 1 of [B, n, n, c] is contiguous for one batch entry; of dimension 2,
  // never (unless it is the whole).
  const auto contiguous = [&](int d, int64_t n) { return n == N || (d == 1 && B == 1); };
  const auto layerNormRows = [&](int64_t rows, int64_t channels, bool contig) {
    const int64_t out = rows * channels * es;
    if (!contig) m.alloc(out);
    m.alloc(out);
    m.alloc(2 * rows * 4);
    m.release(2 * rows * 4);
    if (!contig) m.release(out);
    return out;
  };
  // sigmoid(linear(zn, Wg)) * linear(zn, W) on `rows` positions: four tensors of the hidden
  // width alive at the product, the input copied for each linear when strided.
  const auto projection = [&](int64_t rows, bool contig) {
    const int64_t hid = rows * H * es, copy = contig ? 0 : rows * C * es;
    for (int k = 0; k < 2; ++k) {
      m.alloc(copy);
      m.alloc(hid);
      m.release(copy);
      if (k == 0) m.alloc(hid);  // sigmoid
    }
    m.alloc(hid);  // the product
    m.release(3 * hid);
    return hid;
  };
  for (int64_t l = 0; l < shape.layers; ++l) {
    const int64_t zn = layerNormRows(B * N * N, C, true);
    const int64_t whole = projection(B * N * N, true);
    m.alloc(Ez);  // the triangle region's output
    for (int64_t s = 0; s < N; s += step) {
      const int64_t n = std::min(N, s + step) - s;
      const int64_t rows = B * n * N;  // positions in the chunk
      const int64_t part = projection(rows, contiguous(1, n));
      // x = a b^T over k: batched matmul of permuted views, both sides copied when B > 1.
      const int64_t x = rows * H * es;
      const int64_t copies = B > 1 ? part + whole : 0;
      m.alloc(copies);
      m.alloc(x);
      m.release(copies);
      const int64_t lnx = layerNormRows(rows, H, false);  // x is a permuted view
      m.alloc(rows * C * es);                             // o = LN(x) Wo
      m.release(lnx);
      const bool gateContig = dim == 1 ? contiguous(1, n) : contiguous(2, n);
      if (!gateContig) m.alloc(rows * C * es);
      m.alloc(rows * C * es);  // zn Wg
      if (!gateContig) m.release(rows * C * es);
      m.alloc(rows * C * es);  // sigmoid
      m.alloc(rows * C * es);  // the gated update
      m.release(2 * rows * C * es);
      m.release(x + rows * C * es + part);  // x, o, and the chunk's projection at return
      m.release(rows * C * es);             // copied into place
    }
    m.alloc(Ez);  // u = z + update
    m.release(Ez);
    m.alloc(Ez);  // the transition region's output
    for (int64_t s = 0; s < N; s += step) {
      const int64_t n = std::min(N, s + step) - s;
      const int64_t rows = B * n * N, E = rows * C * es;
      const int64_t h = layerNormRows(rows, C, contiguous(dim, n));
      m.alloc(4 * E);  // W1
      m.alloc(4 * E);  // relu
      m.alloc(E);      // W2
      m.alloc(E);      // residual
      m.release(9 * E + h);
      m.release(E);  // copied into place
    }
    m.release(Ez + zn + whole);  // u, zn and the whole projection at the iteration's end
    if (l > 0) m.release(Ez);    // the previous layer's output
  }
  return m.peak();
}

ChunkSearch searchChunkPlan(const reference::TransformerShape& shape, int64_t elementBytes,
                            int64_t maxMemory) {
  TORCH_CHECK(!shape.training, "the chunk search models inference only (mode: inference)");
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
