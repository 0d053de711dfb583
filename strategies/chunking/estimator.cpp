// The node-by-node memory estimator of the chunking family (estimator.h). Each function below
// mirrors one function of reference/transformer.cpp or chunked_regions.cpp and replays its
// allocations on a counter: alloc when a tensor is made, release when its last holder goes.

#include "strategies/chunking/estimator.h"

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <vector>

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
  // A chunk of rows of [B, T, D] is contiguous only for one sequence or the whole sequence.
  bool contiguous(int64_t n) const { return B == 1 || n == T; }
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

int64_t onlineAttention(Counter& m, const Sizes& s, int64_t chunk, bool keepLse = false) {
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

// ---------------------------------------------------------------------------------------------
// Training: autograd's tape, replayed.
//
// A forward with grad mode records, op by op, the tensors each backward node saves; the backward
// runs the nodes in reverse order of creation (autograd's order for these graphs), and each
// node allocates its inputs' gradients, then drops the gradient it consumed and its saved
// tensors, then its parameters' gradient temporaries (accumulated in place into .grad, which
// lives across steps; a slice of a fused parameter first becomes a full-size zero-padded
// gradient). Gradients meeting at one tensor are added into a new buffer; a leaf keeps the
// first gradient it gets and adds later ones in place. Storage is reference counted: a view
// holds its base, a saved tensor lives until its node has run.

class Tape {
 public:
  explicit Tape(Counter& m) : m_(m) {}
  Counter& counter() { return m_; }

  int alloc(int64_t bytes) {
    m_.alloc(bytes);
    store_.push_back({bytes, 1});
    return static_cast<int>(store_.size()) - 1;
  }
  // A handle on bytes the counter already holds (a region's output).
  int adopt(int64_t bytes) {
    store_.push_back({bytes, 1});
    return static_cast<int>(store_.size()) - 1;
  }
  void ref(int h) {
    if (h >= 0) ++store_[h].refs;
  }
  void unref(int h) {
    if (h < 0) return;
    if (--store_[h].refs == 0) {
      m_.release(store_[h].bytes);
      unref(store_[h].base);
    }
  }
  // A view of `h` (no bytes of its own; holds its base), strided when `strided`.
  int view(int h, bool strided) {
    ref(h);
    store_.push_back({0, 1, h, strided});
    return static_cast<int>(store_.size()) - 1;
  }
  // Whether a backward consuming gradient `h` first makes it contiguous.
  bool strided(int h) const { return h >= 0 && store_[h].strided; }
  int64_t bytes(int h) const { return h < 0 ? 0 : store_[h].bytes; }

  int slot() { return nextSlot_++; }
  void leaf(int slot) { leaves_.insert(slot); }

  // A parameter's gradient temporary, from inside a node's backward.
  void paramGrad(int64_t bytes, int64_t fullBytes = 0) {
    m_.alloc(bytes);
    params_.push_back({bytes, fullBytes});
  }

  using Fn = std::function<std::vector<std::pair<int, int>>(const std::vector<int>& grads)>;
  // A node consuming the gradients of `outs` and saving `saved` (referenced until it runs).
  void node(std::vector<int> outs, std::vector<int> saved, Fn fn) {
    for (int h : saved) ref(h);
    nodes_.push_back({std::move(outs), std::move(saved), std::move(fn)});
  }

  // Runs every node from the last; `grads` holds the seeded gradients and ends with the leaves'.
  // A region's backward records and runs its own chunks' tapes meanwhile: this call owns the
  // nodes recorded so far.
  void backward(std::map<int, int>& grads) {
    std::vector<Node> nodes;
    nodes.swap(nodes_);
    for (auto it = nodes.rbegin(); it != nodes.rend(); ++it) {
      std::vector<int> in;
      bool any = false;
      for (int s : it->outs) {
        auto g = grads.find(s);
        in.push_back(g == grads.end() ? -1 : g->second);
        if (g != grads.end()) {
          any = true;
          grads.erase(g);
        }
      }
      std::vector<std::pair<int, int>> out;
      if (any) out = it->fn(in);
      for (int g : in) unref(g);
      for (int h : it->saved) unref(h);
      std::vector<ParamTemp> params;
      params.swap(params_);
      for (const auto& p : params) {
        if (p.full > 0) {
          m_.alloc(p.full);
          m_.release(p.bytes);
          m_.release(p.full);
        } else {
          m_.release(p.bytes);
        }
      }
      for (const auto& [s, g] : out) accumulate(grads, s, g);
    }
  }

 private:
  void accumulate(std::map<int, int>& grads, int slot, int g) {
    auto it = grads.find(slot);
    if (slot < 0) {
      unref(g);
    } else if (it == grads.end()) {
      grads[slot] = g;
    } else if (leaves_.count(slot)) {
      unref(g);  // added in place into the leaf's gradient
    } else {
      const int sum = alloc(bytes(g));
      unref(it->second);
      unref(g);
      it->second = sum;
    }
  }

  struct Storage {
    int64_t bytes;
    int refs;
    int base = -1;
    bool strided = false;
  };
  struct Node {
    std::vector<int> outs;
    std::vector<int> saved;
    Fn fn;
  };
  struct ParamTemp {
    int64_t bytes, full;
  };
  Counter& m_;
  std::vector<Storage> store_;
  std::vector<Node> nodes_;
  std::vector<ParamTemp> params_;
  std::set<int> leaves_;
  int nextSlot_ = 0;
};

// A differentiable value: its gradient slot and its storage.
struct Val {
  int slot = -1;
  int h = -1;
};

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

// The transformer's ops with their tapes (reference/transformer.cpp, chunked_regions.cpp).
class TapedTransformer {
 public:
  TapedTransformer(Tape& t, const Sizes& s) : t_(t), s_(s) {}

  int64_t E(int64_t n) const { return s_.rows(n); }
  bool contiguous(int64_t n) const { return s_.contiguous(n); }

  // x[:, b:b+n] of a tensor of the whole sequence.
  Val rows(const Val& x) { return tapedView(t_, x, E(s_.T)); }

  Val layerNorm(const Val& x, int64_t n, bool contig) {
    return tapedLayerNorm(t_, x, s_.B * n, s_.D, s_.es, contig);
  }

  // at::linear on n rows of `in` features; `fullW`/`fullB`: the fused parameter it slices.
  Val linear(const Val& x, int64_t n, int64_t in, int64_t out, bool contig, int64_t fullW = 0,
             int64_t fullB = 0) {
    const int64_t es = s_.es, B = s_.B;
    const int copy = contig ? -1 : t_.alloc(B * n * in * es);
    const Val y{t_.slot(), t_.alloc(B * n * out * es)};
    t_.node({y.slot}, {copy >= 0 ? copy : x.h},
            [this, x, n, in, out, es, B, fullW, fullB](const std::vector<int>& g) {
              // A strided gradient (a chunk of the region's) is made contiguous first.
              const int64_t copy = t_.strided(g[0]) ? B * n * out * es : 0;
              t_.counter().alloc(copy);
              const int gx = t_.alloc(B * n * in * es);
              t_.paramGrad(out * in * es, fullW);
              t_.paramGrad(out * es, fullB);
              t_.counter().release(copy);
              return std::vector<std::pair<int, int>>{{x.slot, gx}};
            });
    t_.unref(copy);
    return y;
  }

  Val gelu(const Val& x) { return tapedElementwise(t_, x, false); }
  // a + b on `n` rows.
  Val add(const Val& a, const Val& b, int64_t n) { return tapedAdd(t_, a, b, E(n)); }

  // keysValues: the projection to keys and values, split, as heads.
  std::pair<Val, Val> keysValues(const Val& h) {
    const int64_t D = s_.D, T = s_.T;
    const Val kv = linear(h, T, D, 2 * D, true, 3 * D * D * s_.es, 3 * D * s_.es);
    // chunk(2): one node taking both halves' gradients back into one buffer.
    const Val k0{t_.slot(), kv.h}, v0{t_.slot(), kv.h};
    t_.ref(kv.h);
    t_.ref(kv.h);
    t_.node({k0.slot, v0.slot}, {}, [this, kv](const auto&) {
      return std::vector<std::pair<int, int>>{{kv.slot, t_.alloc(t_.bytes(kv.h))}};
    });
    const Val k = tapedView(t_, k0, E(T)), v = tapedView(t_, v0, E(T));
    t_.unref(kv.h);
    t_.unref(k0.h);
    t_.unref(v0.h);
    return {k, v};
  }

  // Transformer::attention with its tape, for `n` query rows from `begin` and `keys` keys.
  Val attention(const Val& hRows, int64_t n, int64_t begin, const Val& k, const Val& v,
                int64_t keys) {
    const int64_t D = s_.D, es = s_.es, S = s_.B * s_.H * n * keys * es;
    const bool fold = s_.B > 1;
    const Val qlin = linear(hRows, n, D, D, contiguous(n), 3 * D * D * es, 3 * D * es);
    const Val q = tapedView(t_, qlin, E(n));
    const Val kk = rows(k), vv = rows(v);
    // q k^T: batched over [B, H], the operands made contiguous when B > 1 (saved by bmm).
    const int qc = fold ? t_.alloc(E(n)) : -1, kc = fold ? t_.alloc(E(keys)) : -1;
    const Val sc{t_.slot(), t_.alloc(S)};
    t_.node({sc.slot}, fold ? std::vector<int>{qc, kc} : std::vector<int>{qlin.h, k.h},
            [this, q, kk, n, keys](const auto&) {
              const int gk = t_.alloc(E(keys));
              const int gq = t_.alloc(E(n));
              return std::vector<std::pair<int, int>>{{kk.slot, gk}, {q.slot, gq}};
            });
    t_.unref(qc);
    t_.unref(kc);
    // / sqrt(d_head): a wrapped scalar and its float copy, nothing saved.
    t_.counter().alloc(12);
    const Val d{t_.slot(), t_.alloc(S)};
    t_.counter().release(12);
    t_.unref(sc.h);
    t_.node({d.slot}, {}, [this, sc, S](const auto&) {
      t_.counter().alloc(12);
      const int g = t_.alloc(S);
      t_.counter().release(12);
      return std::vector<std::pair<int, int>>{{sc.slot, g}};
    });
    Val masked = d;
    if (s_.causal) {
      const int qpos = t_.alloc(n * 8), kpos = t_.alloc(keys * 8);
      const int mask = t_.alloc(n * keys);
      masked = Val{t_.slot(), t_.alloc(S)};
      t_.unref(d.h);
      t_.unref(kpos);
      t_.unref(qpos);
      t_.node({masked.slot}, {mask}, [this, d, S](const auto&) {
        return std::vector<std::pair<int, int>>{{d.slot, t_.alloc(S)}};
      });
      t_.unref(mask);
    }
    const Val p{t_.slot(), t_.alloc(S)};
    t_.unref(masked.h);
    t_.node({p.slot}, {p.h}, [this, masked, S](const auto&) {
      return std::vector<std::pair<int, int>>{{masked.slot, t_.alloc(S)}};
    });
    const int vc = fold ? t_.alloc(E(keys)) : -1;
    const Val y1{t_.slot(), t_.alloc(E(n))};
    t_.node({y1.slot}, {p.h, fold ? vc : v.h}, [this, vv, p, keys, S](const auto&) {
      const int gv = t_.alloc(E(keys));
      const int gp = t_.alloc(S);
      return std::vector<std::pair<int, int>>{{vv.slot, gv}, {p.slot, gp}};
    });
    t_.unref(vc);
    // transpose + reshape: a copy, whose backward copies the gradient back.
    const Val yc{t_.slot(), t_.alloc(E(n))};
    t_.unref(y1.h);
    t_.node({yc.slot}, {}, [this, y1, n](const auto&) {
      return std::vector<std::pair<int, int>>{{y1.slot, t_.alloc(E(n))}};
    });
    const Val o = linear(yc, n, D, D, true);
    t_.unref(yc.h);
    t_.unref(p.h);
    t_.unref(q.h);
    t_.unref(kk.h);
    t_.unref(vv.h);
    t_.unref(qlin.h);
    return o;
  }

  // OnlineAttentionExecutor::forward in training (online_attention.cpp): the queries, then
  // OnlineAttentionFn, one node: its forward the walk (`kernel`: the CUDA kernel's dispatcher)
  // on the counter, saving q, k, v (views), the output and the log-sum-exp; its backward
  // kernels::onlineSoftmaxAttentionBackward's walk over key blocks of `chunk`. Then the heads
  // merged (a view of the walk's output, laid out as q; a copy of the kernel's) and the output
  // projection, which is returned.
  Val onlineAttention(const Val& h, const Val& k, const Val& v, int64_t chunk, bool kernel) {
    const int64_t D = s_.D, es = s_.es, T = s_.T, Eall = E(T);
    const Val qlin = linear(h, T, D, D, true, 3 * D * D * es, 3 * D * es);
    const Val q = tapedView(t_, qlin, Eall);
    Counter& m = t_.counter();
    int64_t lseBytes = s_.B * s_.H * T * es;
    if (kernel) {
      lseBytes = kernelAttention(m, s_);  // the output and lse stay
    } else {
      chunking::onlineAttention(m, s_, chunk, /*keepLse=*/true);  // the output and lse stay
    }
    const Val out{t_.slot(), t_.adopt(Eall)};
    const int lse = t_.adopt(lseBytes);
    t_.node({out.slot}, {q.h, k.h, v.h, out.h, lse}, [this, q, k, v, chunk](const auto&) {
      return onlineAttentionBackward(q, k, v, chunk);
    });
    t_.unref(lse);
    // The heads merged: a view of the walk's output; a copy of the kernel's, contiguous per head.
    // Either way the gradient comes back as a strided view of the projection's.
    const Val y{t_.slot(), kernel ? t_.alloc(Eall) : out.h};
    if (!kernel) t_.ref(out.h);
    t_.node({y.slot}, {}, [this, out](const std::vector<int>& g) {
      return std::vector<std::pair<int, int>>{{out.slot, t_.view(g[0], true)}};
    });
    const Val o = linear(y, T, D, D, true);
    t_.unref(y.h);
    t_.unref(out.h);
    t_.unref(q.h);
    t_.unref(qlin.h);
    return o;
  }

  // kernels::onlineSoftmaxAttentionBackward on the counter; the gradients of q, k and v.
  std::vector<std::pair<int, int>> onlineAttentionBackward(const Val& q, const Val& k, const Val& v,
                                                           int64_t chunk) {
    Counter& m = t_.counter();
    const int64_t T = s_.T, Eall = E(T), es = s_.es;
    const int64_t rowS = s_.B * s_.H * T * es, flags = s_.B * s_.H * T;
    const bool fold = s_.B > 1;  // folding [B, H] for a product copies strided head views
    scaledQueries(m, s_);
    m.alloc(Eall);  // dout * out
    m.alloc(rowS);  // delta, its row sum
    m.release(Eall);
    m.alloc(rowS + flags + rowS);  // zeros_like(lse), isneginf, the shift
    m.release(rowS + flags);
    const int gq = t_.alloc(Eall), gk = t_.alloc(Eall), gv = t_.alloc(Eall);
    m.alloc(T * 8);  // the last key of each query row
    m.alloc(8);      // add_'s wrapped scalar
    m.release(8);
    for (int64_t start = 0; start < T; start += chunk) {
      const int64_t len = std::min(chunk, T - start), Ek = s_.rows(len);
      const int64_t S = s_.B * s_.H * T * len * es;
      const int64_t copyQK = fold ? Eall + Ek : 0, copyE = fold ? Eall : 0, copyK = fold ? Ek : 0;
      m.alloc(copyQK);  // scaledQ and the keys' transpose made contiguous
      m.alloc(S);       // the scores, then p in place
      m.release(copyQK);
      if (s_.causal) {
        m.alloc(len * 8 + T * len);  // the keys' positions and the bool mask
        m.release(len * 8 + T * len);
      }
      m.alloc(copyE);  // dout made contiguous
      m.alloc(Ek);     // p^T dout, copied into dv
      m.release(copyE);
      m.release(Ek);
      m.alloc(copyQK);  // dout and the values' transpose made contiguous
      m.alloc(S);       // ds = (dout v^T - delta) * p
      m.release(copyQK);
      m.alloc(copyK);  // the keys made contiguous
      m.alloc(Eall);   // ds k, added into dq
      m.release(copyK);
      m.release(Eall);
      m.alloc(copyE);  // scaledQ made contiguous
      m.alloc(Ek);     // ds^T scaledQ, copied into dk
      m.release(copyE);
      m.release(Ek);
      m.release(2 * S);
    }
    m.release(T * 8 + rowS + rowS + Eall);  // the last keys, the shift, delta, scaledQ
    return {{q.slot, gq}, {k.slot, gk}, {v.slot, gv}};
  }

  Val ffn(const Val& h, int64_t n) {
    const int64_t D = s_.D;
    const Val u = linear(h, n, D, 4 * D, true);
    const Val g = gelu(u);
    const Val f = linear(g, n, 4 * D, D, true);
    t_.unref(u.h);
    t_.unref(g.h);
    return f;
  }

  // A chunked region over the sequence (tapedRegion).
  Val region(const std::vector<Val>& in, const std::function<int64_t(int64_t, int64_t)>& forward,
             const std::function<Val(const std::vector<Val>&, int64_t, int64_t)>& taped,
             int64_t chunk) {
    const int64_t T = s_.T;
    const bool batched = s_.B > 1;
    return tapedRegion(t_, in, E(T), T, chunk, forward, taped,
                       [batched, T](int64_t b, int64_t e) { return batched && e - b < T; });
  }

 private:
  Tape& t_;
  const Sizes& s_;
};

// One training step of the chunked executor (chunked_regions.cpp: layer() and step()).
int64_t trainingPeak(const Sizes& s, const ChunkPlan& plan, int64_t layers) {
  const ChunkPlan p = plan.region == "none" ? ChunkPlan{"attention", s.T} : plan;
  Counter m;
  Tape t(m);
  TapedTransformer tt(t, s);
  const int64_t T = s.T, E = s.rows(T);
  const auto keyEnd = [&](int64_t e) { return s.causal ? e : T; };
  const auto contiguous = [&](int64_t n) { return s.contiguous(n); };
  Val x{t.slot(), -1};  // the input: a leaf, allocated before the step
  t.leaf(x.slot);
  for (int64_t l = 0; l < layers; ++l) {
    Val out;
    // The rest of a block whose attention output is `a`: r = x + a, then r + ffn(LN2(r)); the
    // locals h, k and v go with the block's.
    const auto rest = [&](const Val& a, const Val& h, const Val& k, const Val& v) {
      const Val r = tt.add(x, a, T);
      t.unref(a.h);
      const Val l2 = tt.layerNorm(r, T, true);
      const Val f = tt.ffn(l2, T);
      const Val o = tt.add(r, f, T);
      for (int hnd : {f.h, l2.h, r.h, k.h, v.h, h.h}) t.unref(hnd);
      return o;
    };
    if (p.region == "online" || p.region == "online/cuda") {
      const Val h = tt.layerNorm(x, T, true);
      const auto [k, v] = tt.keysValues(h);
      out = rest(tt.onlineAttention(h, k, v, std::min(p.chunk, T), p.region == "online/cuda"), h, k,
                 v);
    } else if (p.region == "attention") {
      const Val h = tt.layerNorm(x, T, true);
      const auto [k, v] = tt.keysValues(h);
      const Val a = tt.region(
          {h, k, v},
          [&](int64_t b, int64_t e) {
            return attention(m, s, e - b, keyEnd(e), contiguous(e - b));
          },
          [&](const std::vector<Val>& in, int64_t b, int64_t e) {
            const Val hs = tt.rows(in[0]);
            const Val o = tt.attention(hs, e - b, b, in[1], in[2], keyEnd(e));
            t.unref(hs.h);
            return o;
          },
          p.chunk);
      out = rest(a, h, k, v);
    } else if (p.region == "ffn") {
      const Val h = tt.layerNorm(x, T, true);
      const auto [k, v] = tt.keysValues(h);
      const Val a = tt.attention(h, T, 0, k, v, T);
      const Val r = tt.add(x, a, T);
      t.unref(a.h);
      const Val f = tt.region(
          {r},
          [&](int64_t b, int64_t e) {
            const int64_t n = e - b;
            const int64_t l2 = layerNorm(m, s, n, contiguous(n));
            const int64_t part = ffn(m, s, n);
            m.release(l2);
            return part;
          },
          [&](const std::vector<Val>& in, int64_t b, int64_t e) {
            const int64_t n = e - b;
            const Val rs = tt.rows(in[0]);
            const Val l2 = tt.layerNorm(rs, n, contiguous(n));
            const Val o = tt.ffn(l2, n);
            t.unref(l2.h);
            t.unref(rs.h);
            return o;
          },
          p.chunk);
      out = tt.add(r, f, T);
      for (int hnd : {f.h, r.h, k.h, v.h, h.h}) t.unref(hnd);
    } else if (p.region == "block") {
      const Val h = tt.layerNorm(x, T, true);
      const auto [k, v] = tt.keysValues(h);
      t.unref(h.h);
      out = tt.region(
          {x, k, v},
          [&](int64_t b, int64_t e) {
            return blockChunk(m, s, e - b, keyEnd(e), contiguous(e - b));
          },
          [&](const std::vector<Val>& in, int64_t b, int64_t e) {
            const int64_t n = e - b;
            const Val xs = tt.rows(in[0]);
            const Val l1 = tt.layerNorm(xs, n, contiguous(n));
            const Val a = tt.attention(l1, n, b, in[1], in[2], keyEnd(e));
            t.unref(l1.h);  // a temporary of a's expression
            const Val rs = tt.add(xs, a, n);
            const Val l2 = tt.layerNorm(rs, n, true);
            const Val f = tt.ffn(l2, n);
            const Val o = tt.add(rs, f, n);
            for (int hnd : {f.h, l2.h, rs.h, a.h, xs.h}) t.unref(hnd);
            return o;
          },
          p.chunk);
      t.unref(k.h);
      t.unref(v.h);
    } else {  // ln_residual: four token-wise regions around attention and the feed-forward
      const Val none{-1, -1};
      const auto norm = [&](const Val& in) {
        return tt.region(
            {in}, [&](int64_t b, int64_t e) { return layerNorm(m, s, e - b, contiguous(e - b)); },
            [&](const std::vector<Val>& lv, int64_t b, int64_t e) {
              const Val xs = tt.rows(lv[0]);
              const Val o = tt.layerNorm(xs, e - b, contiguous(e - b));
              t.unref(xs.h);
              return o;
            },
            p.chunk);
      };
      const auto sum = [&](const Val& a, const Val& b2) {
        return tt.region(
            {a, b2},
            [&](int64_t b, int64_t e) {
              m.alloc(s.rows(e - b));
              return s.rows(e - b);
            },
            [&](const std::vector<Val>& lv, int64_t b, int64_t e) {
              const Val as = tt.rows(lv[0]), bs = tt.rows(lv[1]);
              const Val o = tt.add(as, bs, e - b);
              t.unref(as.h);
              t.unref(bs.h);
              return o;
            },
            p.chunk);
      };
      const Val h = norm(x);
      const auto [k, v] = tt.keysValues(h);
      const Val a = tt.attention(h, T, 0, k, v, T);
      const Val r = sum(x, a);
      const Val h2 = norm(r);
      const Val f = tt.ffn(h2, T);
      out = sum(r, f);
      for (int hnd : {f.h, h2.h, r.h, a.h, k.h, v.h, h.h}) t.unref(hnd);
      (void)none;
    }
    if (l > 0) t.unref(x.h);  // the previous layer's output, now held by this layer's tape
    x = out;
  }
  // results_.clear(): the previous step's output and input gradient.
  m.release(2 * E);
  // loss = sum(x * target): the product and the sum live until backward returns; the seed
  // gradient, ones, and its product with the target.
  const int prod = t.alloc(E), total = t.alloc(s.es), ones = t.alloc(s.es);  // scalars of the dtype
  std::map<int, int> grads{{x.slot, t.alloc(E)}};
  t.backward(grads);
  t.unref(ones);
  t.unref(total);
  t.unref(prod);
  return m.peak();
}

// The pair stack's inference allocations (reference/evoformer.cpp), per region chunk.
class PairInference {
 public:
  PairInference(Counter& m, const reference::PairShape& shape, int dim, int64_t es)
      : m_(m), B(shape.batch), N(shape.n), C(shape.c), H(shape.hidden), dim_(dim), es_(es) {}

  // A chunk of dimension 1 of [B, n, n, c] is contiguous for one batch entry; of dimension 2,
  // never (unless it is the whole).
  bool contiguous(int d, int64_t n) const { return n == N || (d == 1 && B == 1); }

  int64_t layerNormRows(int64_t rows, int64_t channels, bool contig) {
    const int64_t out = rows * channels * es_;
    if (!contig) m_.alloc(out);
    m_.alloc(out);
    m_.alloc(2 * rows * 4);
    m_.release(2 * rows * 4);
    if (!contig) m_.release(out);
    return out;
  }
  // sigmoid(linear(zn, Wg)) * linear(zn, W) on `rows` positions: four tensors of the hidden
  // width alive at the product, the input copied for each linear when strided.
  int64_t projection(int64_t rows, bool contig) {
    const int64_t hid = rows * H * es_, copy = contig ? 0 : rows * C * es_;
    for (int k = 0; k < 2; ++k) {
      m_.alloc(copy);
      m_.alloc(hid);
      m_.release(copy);
      if (k == 0) m_.alloc(hid);  // sigmoid
    }
    m_.alloc(hid);  // the product
    m_.release(3 * hid);
    return hid;
  }
  // One chunk of `n` of the triangle region; returns its part's bytes, still held. `whole`:
  // the bytes of the other operand, projected on every position.
  int64_t triangleChunk(int64_t n, int64_t whole) {
    const int64_t rows = B * n * N;  // positions in the chunk
    const int64_t part = projection(rows, contiguous(1, n));
    // x = a b^T over k: batched matmul of permuted views, both sides copied when B > 1.
    const int64_t x = rows * H * es_;
    const int64_t copies = B > 1 ? part + whole : 0;
    m_.alloc(copies);
    m_.alloc(x);
    m_.release(copies);
    const int64_t lnx = layerNormRows(rows, H, false);  // x is a permuted view
    m_.alloc(rows * C * es_);                           // o = LN(x) Wo
    m_.release(lnx);
    const bool gateContig = dim_ == 1 ? contiguous(1, n) : contiguous(2, n);
    if (!gateContig) m_.alloc(rows * C * es_);
    m_.alloc(rows * C * es_);  // zn Wg
    if (!gateContig) m_.release(rows * C * es_);
    m_.alloc(rows * C * es_);  // sigmoid
    m_.alloc(rows * C * es_);  // the gated update
    m_.release(2 * rows * C * es_);
    m_.release(x + rows * C * es_ + part);  // x, o, and the chunk's projection at return
    return rows * C * es_;
  }
  // One chunk of `n` of the transition region; returns its part's bytes, still held.
  int64_t transitionChunk(int64_t n) {
    const int64_t rows = B * n * N, E = rows * C * es_;
    const int64_t h = layerNormRows(rows, C, contiguous(dim_, n));
    m_.alloc(4 * E);  // W1
    m_.alloc(4 * E);  // relu
    m_.alloc(E);      // W2
    m_.alloc(E);      // residual
    m_.release(9 * E + h);
    return E;
  }

 private:
  Counter& m_;
  int64_t B, N, C, H;
  int dim_;
  int64_t es_;
};

// The pair stack's ops with their tapes (reference/evoformer.cpp, chunked_pair.cpp), on
// tensors of `rows` positions.
class TapedPair {
 public:
  TapedPair(Tape& t, int64_t es) : t_(t), es_(es) {}

  // at::linear on a 4-D input: a matmul over the folded rows (a strided input copied first,
  // and saved so), then the bias added in place: two nodes.
  Val linear(const Val& x, int64_t rows, int64_t in, int64_t out, bool contig) {
    const int copy = contig ? -1 : t_.alloc(rows * in * es_);
    const Val mm{t_.slot(), t_.alloc(rows * out * es_)};
    t_.node({mm.slot}, {copy >= 0 ? copy : x.h}, [this, x, rows, in, out](const auto&) {
      t_.paramGrad(out * in * es_);
      return std::vector<std::pair<int, int>>{{x.slot, t_.alloc(rows * in * es_)}};
    });
    t_.unref(copy);
    const Val y{t_.slot(), mm.h};
    t_.node({y.slot}, {}, [this, mm, out](const std::vector<int>& g) {
      t_.paramGrad(out * es_);
      t_.ref(g[0]);
      return std::vector<std::pair<int, int>>{{mm.slot, g[0]}};
    });
    return y;
  }
  Val mul(const Val& a, const Val& b) {
    const int64_t bytes = std::max(t_.bytes(a.h), t_.bytes(b.h));
    const Val y{t_.slot(), t_.alloc(bytes)};
    t_.node({y.slot}, {a.h, b.h}, [this, a, b, bytes](const auto&) {
      const int gb = t_.alloc(bytes);
      const int ga = t_.alloc(bytes);
      return std::vector<std::pair<int, int>>{{b.slot, gb}, {a.slot, ga}};
    });
    return y;
  }
  // sigmoid(linear(zn, Wg)) * linear(zn, W): the right operand first, as GCC evaluates it.
  Val projection(const Val& zn, int64_t rows, int64_t C, int64_t H, bool contig) {
    const Val p = linear(zn, rows, C, H, contig);
    const Val g = linear(zn, rows, C, H, contig);
    const Val sg = tapedElementwise(t_, g, true);
    t_.unref(g.h);
    const Val y = mul(sg, p);
    t_.unref(sg.h);
    t_.unref(p.h);
    return y;
  }
  // einsum("bikh,bjkh->bijh") of a (`aBytes`) and b (`bBytes`): one batched matmul of
  // permuted views, both operands copied when B > 1 (and saved so). Gradients come back
  // strided: a leaf's is cloned when accumulated.
  Val einsum(const Val& a, int64_t aBytes, const Val& b, int64_t bBytes, int64_t xBytes,
             bool copies) {
    const int ca = copies ? t_.alloc(aBytes) : -1;
    const int cb = copies ? t_.alloc(bBytes) : -1;
    const Val x{t_.slot(), t_.alloc(xBytes)};
    t_.node({x.slot}, copies ? std::vector<int>{ca, cb} : std::vector<int>{a.h, b.h},
            [this, a, b, aBytes, bBytes](const auto&) {
              const int gb = t_.alloc(bBytes);
              const int ga = t_.alloc(aBytes);
              return std::vector<std::pair<int, int>>{{b.slot, gb}, {a.slot, ga}};
            });
    t_.unref(ca);
    t_.unref(cb);
    return x;
  }

 private:
  Tape& t_;
  int64_t es_;
};

// One training step of the pair executor (chunked_pair.cpp: step()).
int64_t pairTrainingPeak(const reference::PairShape& shape, int dim, int64_t chunk, int64_t es) {
  const int64_t B = shape.batch, N = shape.n, C = shape.c, H = shape.hidden;
  const int64_t all = B * N * N, Ez = all * C * es, step = std::min(chunk, N);
  Counter m;
  Tape t(m);
  TapedPair tp(t, es);
  PairInference inf(m, shape, dim, es);
  const auto contiguous = [&](int d, int64_t n) { return inf.contiguous(d, n); };
  const auto region =
      [&](const std::vector<Val>& in, int chunkDim, const std::function<int64_t(int64_t)>& forward,
          const std::function<Val(const std::vector<Val>&, int64_t, int64_t)>& taped) {
        return tapedRegion(
            t, in, Ez, N, step, [forward](int64_t b, int64_t e) { return forward(e - b); }, taped,
            [&contiguous, chunkDim](int64_t b, int64_t e) { return !contiguous(chunkDim, e - b); });
      };
  Val z{t.slot(), -1};
  t.leaf(z.slot);
  for (int64_t l = 0; l < shape.layers; ++l) {
    const Val zn = tapedLayerNorm(t, z, all, C, es, true);
    const Val whole = tp.projection(zn, all, C, H, true);
    const Val tri = region(
        {zn, whole}, dim,
        [&](int64_t n) { return inf.triangleChunk(n, whole.h >= 0 ? all * H * es : 0); },
        [&](const std::vector<Val>& in, int64_t s, int64_t e) {
          const int64_t n = e - s, rows = B * n * N;
          const Val z1 = tapedView(t, in[0], Ez);  // zn.narrow(1, s, n)
          const Val part = tp.projection(z1, rows, C, H, contiguous(1, n));
          // dim 1: a is the chunk's, b whole; dim 2: a whole, b the chunk's.
          const int64_t partBytes = rows * H * es, wholeBytes = all * H * es;
          const Val x = dim == 1 ? tp.einsum(part, partBytes, in[1], wholeBytes, partBytes, B > 1)
                                 : tp.einsum(in[1], wholeBytes, part, partBytes, partBytes, B > 1);
          const Val xl = tapedLayerNorm(t, x, rows, H, es, false);  // x is a permuted view
          const Val o = tp.linear(xl, rows, H, C, true);
          const Val zg = dim == 1 ? z1 : tapedView(t, in[0], Ez);  // zn.narrow(2, s, n) for dim 2
          const Val g = tp.linear(zg, rows, C, C, dim == 1 ? contiguous(1, n) : contiguous(2, n));
          const Val sg = tapedElementwise(t, g, true);
          t.unref(g.h);
          const Val y = tp.mul(sg, o);
          for (int hnd : {sg.h, o.h, xl.h, x.h, part.h, z1.h}) t.unref(hnd);
          if (dim != 1) t.unref(zg.h);
          return y;
        });
    const Val u = tapedAdd(t, z, tri, Ez);
    t.unref(tri.h);
    const Val next = region(
        {u}, dim, [&](int64_t n) { return inf.transitionChunk(n); },
        [&](const std::vector<Val>& in, int64_t s, int64_t e) {
          const int64_t n = e - s, rows = B * n * N;
          const Val zs = tapedView(t, in[0], Ez);
          const Val h = tapedLayerNorm(t, zs, rows, C, es, contiguous(dim, n));
          const Val l1 = tp.linear(h, rows, C, 4 * C, true);
          const Val r = tapedElementwise(t, l1, true);
          const Val l2 = tp.linear(r, rows, 4 * C, C, true);
          const Val y = tapedAdd(t, zs, l2, rows * C * es);
          for (int hnd : {l2.h, r.h, l1.h, h.h, zs.h}) t.unref(hnd);
          return y;
        });
    for (int hnd : {u.h, whole.h, zn.h}) t.unref(hnd);
    if (l > 0) t.unref(z.h);
    z = next;
  }
  m.release(2 * Ez);  // results_.clear(): the previous step's output and input gradient
  const int prod = t.alloc(Ez), total = t.alloc(es), ones = t.alloc(es);  // scalars of the dtype
  std::map<int, int> grads{{z.slot, t.alloc(Ez)}};
  t.backward(grads);
  t.unref(ones);
  t.unref(total);
  t.unref(prod);
  return m.peak();
}

}  // namespace

std::optional<int64_t> estimateActivationPeak(const reference::TransformerShape& shape,
                                              const ChunkPlan& plan, int64_t elementBytes) {
  const Sizes s{shape.batch, shape.seq, shape.dModel, shape.heads, elementBytes, shape.causal};
  if (shape.training) return trainingPeak(s, plan, shape.layers);
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
  if (shape.training) return pairTrainingPeak(shape, dim, chunk, elementBytes);
  const int64_t B = shape.batch, N = shape.n, C = shape.c, es = elementBytes;
  const int64_t Ez = B * N * N * C * es;
  const int64_t step = std::min(chunk, N);
  Counter m;
  PairInference inf(m, shape, dim, es);
  for (int64_t l = 0; l < shape.layers; ++l) {
    const int64_t zn = inf.layerNormRows(B * N * N, C, true);
    const int64_t whole = inf.projection(B * N * N, true);
    m.alloc(Ez);  // the triangle region's output
    for (int64_t s = 0; s < N; s += step) {
      m.release(inf.triangleChunk(std::min(N, s + step) - s, whole));  // copied into place
    }
    m.alloc(Ez);  // u = z + update
    m.release(Ez);
    m.alloc(Ez);  // the transition region's output
    for (int64_t s = 0; s < N; s += step) {
      m.release(inf.transitionChunk(std::min(N, s + step) - s));  // copied into place
    }
    m.release(Ez + zn + whole);  // u, zn and the whole projection at the iteration's end
    if (l > 0) m.release(Ez);    // the previous layer's output
  }
  return m.peak();
}

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
