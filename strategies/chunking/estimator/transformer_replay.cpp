// The node-by-node memory estimator of the chunking family (estimator.h). Each function below
// mirrors one function of reference/transformer.cpp or chunked_regions.cpp and replays its
// allocations on a counter: alloc when a tensor is made, release when its last holder goes.
// This file: a transformer's blocks in inference (prefill), region by region, and
// estimateActivationPeak; training's tape (tape.h, transformer_training.cpp), the Evoformer
// pair stack (evoformer_pair.cpp) and the search (chunk_search.cpp) have files of their own.

#include "strategies/chunking/estimator.h"

#include <algorithm>

#include "strategies/chunking/estimator/estimator_internal.h"

namespace sb::strategies::chunking {
namespace estimator {

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

namespace {

// at::linear on [B, n, in] rows: ATen folds the batch into the rows, copying a strided input.
void linear(Counter& m, const Sizes& s, int64_t n, int64_t in, int64_t out, bool contiguous) {
  const int64_t copy = contiguous ? 0 : s.B * n * in * s.es;
  m.alloc(copy);
  m.alloc(s.B * n * out * s.es);
  m.release(copy);
}

}  // namespace

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
  // / sqrt(d_head): the divisor is wrapped as a double tensor and, for float, copied to one
  // while the quotient is made (as in scaledQueries below). Without a mask this is the
  // attention's peak (vit_encoder).
  const int64_t scalar = s.es == 8 ? 8 : 12;
  m.alloc(scalar);
  m.alloc(scores);
  m.release(scalar);
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

namespace {

int64_t keyEnd(const Sizes& s, int64_t end) { return s.causal ? end : s.T; }

}  // namespace

// kernels::onlineSoftmaxAttentionCpu on the queries, keys and values of every token, keys
// `chunk` at a time (float32 and float64: the walk's arithmetic is the input's own); returns
// the output's bytes, still held. The queries and keys are head views of the projections:
// folding [B, H] for a product copies them when B > 1, as in attention() above.
// Training keeps the log-sum-exp (`keepLse`: OnlineAttentionFn saves it for the backward).
// scaledQ = q * scale, laid out as q, in both walks: the scale is wrapped as a double tensor
// and, for float, copied to one while the product is made.
int64_t scaledQueries(Counter& m, const Sizes& s) {
  const int64_t scalar = s.es == 8 ? 8 : 12;
  m.alloc(scalar);
  m.alloc(s.rows(s.T));
  m.release(scalar);
  return s.rows(s.T);
}

// The CUDA kernel's dispatcher (kernels::onlineSoftmaxAttention): q, k and v made contiguous
// until it returns, the output and the float log-sum-exp it returns; the latter's bytes.
int64_t kernelAttention(Counter& m, const Sizes& s) {
  const int64_t E = s.rows(s.T), lse = s.B * s.H * s.T * 4;
  m.alloc(3 * E + E + lse);
  m.release(3 * E);
  return lse;
}

int64_t onlineAttention(Counter& m, const Sizes& s, int64_t chunk, bool keepLse) {
  const int64_t E = s.rows(s.T), rowS = s.B * s.H * s.T * s.es, flags = s.B * s.H * s.T;
  const bool foldCopies = s.B > 1;
  scaledQueries(m, s);
  m.alloc(2 * rowS + E);  // the running maximum and denominator, the accumulator
  m.alloc(s.T * 8);       // the last key of each query row (int64)
  m.alloc(8);             // add_(tk - tq)'s wrapped scalar
  m.release(8);
  for (int64_t start = 0; start < s.T; start += chunk) {
    const int64_t len = std::min(chunk, s.T - start), Ek = s.rows(len);
    const int64_t scores = s.B * s.H * s.T * len * s.es;
    if (foldCopies) m.alloc(E + Ek);  // scaledQ and the keys' transpose made contiguous
    m.alloc(scores);
    if (foldCopies) m.release(E + Ek);
    if (s.causal) {
      m.alloc(len * 8 + s.T * len);  // the keys' positions and the bool mask
      m.release(len * 8 + s.T * len);
    }
    m.alloc(rowS);  // the block's row maximum
    m.alloc(rowS);  // m_new
    m.release(rowS);
    m.alloc(rowS + flags + rowS);  // zeros_like(m_new), isneginf, the shift
    m.release(flags + rowS);
    m.alloc(scores);  // p = exp(scores - shift)
    m.alloc(rowS);    // the rescale exp(m - shift)
    m.alloc(rowS);    // p's row sum, added into l
    m.release(rowS);
    if (foldCopies) m.alloc(Ek);  // the values made contiguous
    m.alloc(E);                   // p v, added into the accumulator
    if (foldCopies) m.release(Ek);
    m.release(E);
    m.release(rowS);                           // the previous maximum, replaced by m_new
    m.release(rowS + scores + rowS + scores);  // the rescale, p, the shift and the scores
  }
  m.alloc(rowS + flags + rowS);  // ones_like(l), l == 0, and the divisor
  m.release(rowS + flags + rowS);
  m.alloc(2 * rowS);  // log(l) and the log-sum-exp
  m.release(rowS);
  m.release(s.T * 8 + 2 * rowS + E);  // the last keys, l, m and scaledQ at return
  if (!keepLse) m.release(rowS);      // the log-sum-exp, which inference drops
  return E;                           // the accumulator, normalised in place
}

// One chunk of `n` rows of the whole-block region (chunked_regions.cpp, Region::kBlock) against
// `keys` keys; returns its output's bytes, still held.
int64_t blockChunk(Counter& m, const Sizes& s, int64_t n, int64_t keys, bool contiguous) {
  const int64_t l1 = layerNorm(m, s, n, contiguous);
  const int64_t a = attention(m, s, n, keys, true);
  m.release(l1);       // a temporary of a's expression
  m.alloc(s.rows(n));  // rs = xs + a
  const int64_t l2 = layerNorm(m, s, n, true);
  const int64_t f = ffn(m, s, n);
  m.alloc(s.rows(n));  // rs + f
  m.release(f + l2);
  m.release(s.rows(n) + a);  // rs and a at return
  return s.rows(n);
}

namespace {

// One block as ChunkedExecutor::layer runs it; the block's output stays allocated.
void block(Counter& m, const Sizes& s, const ChunkPlan& plan) {
  // Unchunked is the attention region in one chunk: the executor runs it so.
  const ChunkPlan p = plan.region == "none" ? ChunkPlan{"attention", s.T} : plan;
  const int64_t E = s.rows(s.T);
  const int64_t C = std::min(p.chunk, s.T);
  const auto contiguous = [&](int64_t n) { return s.contiguous(n); };
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
  if (p.region == "online" || p.region == "online/cuda") {
    // OnlineAttentionExecutor::forward (online_attention.cpp), with the CPU walk or, on CUDA
    // tensors, the kernel, whose dispatcher makes q, k and v contiguous and writes the output
    // and the float log-sum-exp; its output is contiguous per head, so merging the heads back
    // copies it (the CPU walk's accumulator is laid out as q: there it is a view).
    const bool kernel = p.region == "online/cuda";
    const int64_t h = layerNorm(m, s, s.T, true);
    linear(m, s, s.T, s.D, 2 * s.D, true);  // keys and values
    linear(m, s, s.T, s.D, s.D, true);      // queries
    int64_t heads;
    if (kernel) {
      m.release(kernelAttention(m, s));  // the log-sum-exp, dropped by the executor
      m.alloc(E);                        // the heads merged back: a copy
      heads = 2 * E;
    } else {
      heads = onlineAttention(m, s, C);
    }
    linear(m, s, s.T, s.D, s.D, true);  // the output projection, a temporary
    m.alloc(E);                         // r = x + the projection
    m.release(E);
    const int64_t l2 = layerNorm(m, s, s.T, true);
    const int64_t f = ffn(m, s, s.T);
    m.alloc(E);  // r + f
    m.release(f + l2);
    m.release(E + heads + E + 2 * E + h);  // r, the heads, q, keys and values, h at return
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
    m.release(blockChunk(m, s, e - b, keyEnd(s, e), contiguous(e - b)));  // copied into place
  });
  m.release(2 * E);  // keys and values at return
}

}  // namespace
}  // namespace estimator

std::optional<int64_t> estimateActivationPeak(const reference::TransformerShape& shape,
                                              const ChunkPlan& plan, int64_t elementBytes) {
  const estimator::Sizes s{shape.batch, shape.seq,    shape.dModel,
                           shape.heads, elementBytes, shape.causal};
  if (shape.training) return estimator::trainingPeak(s, plan, shape.layers);
  estimator::Counter m;
  const int64_t E = s.rows(s.T);
  for (int64_t l = 0; l < shape.layers; ++l) {
    estimator::block(m, s, plan);  // leaves the block's output allocated
    if (l > 0) m.release(E);       // the previous block's output, the input of this one
  }
  return m.peak();
}

}  // namespace sb::strategies::chunking
