// The chunking estimator's model of the Evoformer-style pair stack (reference/evoformer.cpp,
// chunked_pair.cpp), chunked over rows or columns: its inference allocations per region chunk and
// its training step on autograd's tape (tape.h), and estimatePairActivationPeak. Its own file:
// a model of its own, sharing only the counter and the tape with the transformer's.

#include "strategies/chunking/estimator.h"

#include <algorithm>
#include <functional>
#include <map>
#include <utility>
#include <vector>

#include "strategies/chunking/estimator/estimator_internal.h"
#include "strategies/chunking/estimator/tape.h"

namespace sb::strategies::chunking {
namespace estimator {
namespace {

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
}  // namespace estimator

std::optional<int64_t> estimatePairActivationPeak(const reference::PairShape& shape, int dim,
                                                  int64_t chunk, int64_t elementBytes) {
  if (shape.training) return estimator::pairTrainingPeak(shape, dim, chunk, elementBytes);
  const int64_t B = shape.batch, N = shape.n, C = shape.c, es = elementBytes;
  const int64_t Ez = B * N * N * C * es;
  const int64_t step = std::min(chunk, N);
  estimator::Counter m;
  estimator::PairInference inf(m, shape, dim, es);
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

}  // namespace sb::strategies::chunking
