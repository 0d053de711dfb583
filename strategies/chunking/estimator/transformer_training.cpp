// The chunking estimator's training replay of the transformer (chunked_regions.cpp: layer() and
// step()): the blocks' ops on autograd's tape (tape.h), each chunked region recomputed in its
// backward, replayed on the counter. Its own file: the inference replay it reuses inside the
// regions' forwards is transformer_replay.cpp.

#include <algorithm>
#include <functional>
#include <map>
#include <utility>
#include <vector>

#include "strategies/chunking/estimator/estimator_internal.h"
#include "strategies/chunking/estimator/tape.h"

namespace sb::strategies::chunking::estimator {
namespace {

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
      estimator::onlineAttention(m, s_, chunk, /*keepLse=*/true);  // the output and lse stay
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

}  // namespace

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

}  // namespace sb::strategies::chunking::estimator
