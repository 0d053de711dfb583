// The CPU online-softmax attention against softmax(scale * q k^T [mask]) v computed whole in
// float64, over shapes that stress the walk over key blocks: Tq != Tk, a last block shorter than
// the others, one key per block, one block for all keys; causal and not. A copy of the walk that
// forgets the exp(m_old - m_new) rescale fails the same comparison, so the comparison can fail.

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <ostream>
#include <string>
#include <tuple>

#include <torch/csrc/autograd/autograd.h>

#include "kernels/attention.h"
#include "kernels/error_stats.h"

namespace sb::kernels {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// True where query i may not see key j: the queries are the last tq of the tk positions.
at::Tensor causalMask(int64_t tq, int64_t tk) {
  const at::Tensor lastKey = at::arange(tq, at::kLong).add_(tk - tq).unsqueeze(1);
  return at::arange(tk, at::kLong).gt(lastKey);
}

// The whole score matrix in float64; a row that sees no key gets 0 and lse -inf, as documented.
AttentionResult referenceAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   bool causal, double scale) {
  at::Tensor scores = at::matmul(q.to(at::kDouble), k.to(at::kDouble).transpose(-2, -1)) * scale;
  if (causal) scores.masked_fill_(causalMask(q.size(2), k.size(2)), -kInf);
  const at::Tensor p = at::softmax(scores, -1).nan_to_num(0.0);  // all -inf rows: NaN -> 0
  return {at::matmul(p, v.to(at::kDouble)), at::logsumexp(scores, -1)};
}

// The planted fault: the walk of onlineSoftmaxAttentionCpu, in float64, but adding each block's
// exp(s - m_new) to sums that are still relative to the older maxima (no exp(m_old - m_new)).
AttentionResult walkWithoutRescale(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   int64_t keyChunk, double scale) {
  const at::Tensor scaledQ = q.to(at::kDouble) * scale;
  at::Tensor m = at::full({q.size(0), q.size(1), q.size(2), 1}, -kInf, scaledQ.options());
  at::Tensor l = at::zeros_like(m);
  at::Tensor acc = at::zeros_like(scaledQ);
  for (int64_t start = 0; start < k.size(2); start += keyChunk) {
    const int64_t len = std::min(keyChunk, k.size(2) - start);
    const at::Tensor scores =
        at::matmul(scaledQ, k.narrow(2, start, len).to(at::kDouble).transpose(-2, -1));
    m = at::maximum(m, scores.amax(-1, true));
    const at::Tensor p = (scores - m).exp();
    l = l + p.sum(-1, true);
    acc = acc + at::matmul(p, v.narrow(2, start, len).to(at::kDouble));
  }
  return {acc / l, (m + l.log()).squeeze(-1)};
}

// `actual` against `expected` where the expected value is finite; where it is -inf (a row that
// sees no key), `actual` must be -inf too.
ErrorStats compareWithInfinities(const at::Tensor& actual, const at::Tensor& expected, double rtol,
                                 double atol) {
  const at::Tensor noKey = expected.isneginf();
  EXPECT_TRUE(at::equal(actual.isneginf(), noKey)) << "the rows without keys differ";
  const at::Tensor seen = noKey.logical_not();
  return errorStatsCpu(actual.masked_select(seen), expected.masked_select(seen), rtol, atol, false);
}

std::string describe(const ErrorStats& s) {
  return std::to_string(s.mismatches) + " of " + std::to_string(s.numel) +
         " elements off, max abs err " + std::to_string(s.maxAbsErr) + ", worst at " +
         std::to_string(s.maxErrRatio) + "x the tolerance";
}

struct Shape {
  const char* name;
  int64_t b, h, tq, tk, d, keyChunk;
};
void PrintTo(const Shape& s, std::ostream* os) { *os << s.name; }

const Shape kShapes[] = {
    {"SquareInEvenBlocks", 2, 3, 64, 64, 16, 16},
    {"FewerQueriesThanKeysAndAShortLastBlock", 2, 2, 37, 100, 24, 16},
    {"MoreQueriesThanKeys", 1, 2, 50, 30, 16, 7},
    {"OneKeyPerBlock", 1, 2, 19, 23, 8, 1},
    {"OneBlockLargerThanAllKeys", 2, 2, 33, 50, 16, 64},
    {"OneBlockOfExactlyAllKeys", 1, 1, 10, 50, 16, 50},
    {"OneQuery", 1, 1, 1, 40, 8, 8},
    {"OneKey", 1, 2, 5, 1, 8, 4},
};

class OnlineSoftmaxAttentionSweep
    : public ::testing::TestWithParam<std::tuple<Shape, bool, at::ScalarType>> {};

TEST_P(OnlineSoftmaxAttentionSweep, MatchesTheWholeSoftmaxInFloat64) {
  const auto& [shape, causal, dtype] = GetParam();
  at::manual_seed(1);
  const at::Tensor q = at::randn({shape.b, shape.h, shape.tq, shape.d}, dtype);
  const at::Tensor k = at::randn({shape.b, shape.h, shape.tk, shape.d}, dtype);
  const at::Tensor v = at::randn({shape.b, shape.h, shape.tk, shape.d}, dtype);
  const double scale = 1.0 / std::sqrt(static_cast<double>(shape.d));

  const AttentionResult got = onlineSoftmaxAttentionCpu(q, k, v, shape.keyChunk, causal, scale);
  const AttentionResult want = referenceAttention(q, k, v, causal, scale);
  ASSERT_EQ(got.out.scalar_type(), dtype);
  ASSERT_EQ(got.out.sizes(), q.sizes());
  ASSERT_EQ(got.lse.scalar_type(), at::kFloat);
  ASSERT_EQ(got.lse.sizes(), at::IntArrayRef({shape.b, shape.h, shape.tq}));

  // Tolerances: both sides start from the same numbers, so they differ only by rounding in the
  // walk's dtype (its blocks sum in another order, and rescale). Unit roundoff u is 6e-8 in
  // float32 and 1.1e-16 in float64; scores and outputs here are O(1) and the worst error seen
  // over this sweep is about 8u absolute (4.5e-7 and 8.9e-16). The tolerances are ~30u absolute
  // plus ~30u relative, 4x room: float32 2e-6 and 2e-6, float64 3e-15 and 3e-15. A wrong walk is
  // off by 1e-2 or more (ForgettingTheRescaleFailsTheSameComparison). lse is float32 for either
  // dtype: rounding it alone is up to half an ulp, 4.8e-7 for |lse| < 16, and float32 scores
  // add little (worst seen 5.2e-7): 2e-6 absolute for both.
  const bool single = dtype == at::kFloat;
  const double outTol = single ? 2e-6 : 3e-15;
  const ErrorStats out = errorStatsCpu(got.out, want.out, outTol, outTol, false);
  EXPECT_EQ(out.mismatches, 0) << "out: " << describe(out);
  const ErrorStats lse = compareWithInfinities(got.lse.to(at::kDouble), want.lse, 0, 2e-6);
  EXPECT_EQ(lse.mismatches, 0) << "lse: " << describe(lse);
}

std::string sweepName(
    const ::testing::TestParamInfo<OnlineSoftmaxAttentionSweep::ParamType>& info) {
  const auto& [shape, causal, dtype] = info.param;
  return std::string(shape.name) + (causal ? "_Causal" : "_Full") +
         (dtype == at::kFloat ? "_Float32" : "_Float64");
}

INSTANTIATE_TEST_SUITE_P(Shapes, OnlineSoftmaxAttentionSweep,
                         ::testing::Combine(::testing::ValuesIn(kShapes), ::testing::Bool(),
                                            ::testing::Values(at::kFloat, at::kDouble)),
                         sweepName);

TEST(OnlineSoftmaxAttention, ForgettingTheRescaleFailsTheSameComparison) {
  at::manual_seed(2);
  const at::Tensor q = at::randn({2, 2, 40, 16}, at::kDouble);
  const at::Tensor k = at::randn({2, 2, 100, 16}, at::kDouble);
  const at::Tensor v = at::randn({2, 2, 100, 16}, at::kDouble);
  const double scale = 0.25;
  const AttentionResult want = referenceAttention(q, k, v, false, scale);
  // The float64 tolerances of the sweep.
  const ErrorStats right = errorStatsCpu(onlineSoftmaxAttentionCpu(q, k, v, 8, false, scale).out,
                                         want.out, 3e-15, 3e-15, false);
  EXPECT_EQ(right.mismatches, 0) << describe(right);
  // Without the rescale a row's early blocks keep weights relative to a smaller maximum, so
  // they count too much: most rows are off by far more than rounding.
  const AttentionResult wrong = walkWithoutRescale(q, k, v, 8, scale);
  const ErrorStats bad = errorStatsCpu(wrong.out, want.out, 3e-15, 3e-15, false);
  EXPECT_GT(bad.mismatches, bad.numel / 2) << describe(bad);
  EXPECT_GT(bad.maxAbsErr, 1e-2) << describe(bad);
  const ErrorStats badLse = errorStatsCpu(wrong.lse, want.lse, 0, 2e-6, false);
  EXPECT_GT(badLse.mismatches, badLse.numel / 2) << describe(badLse);
}

TEST(OnlineSoftmaxAttention, CausalQueriesAreTheLastPositionsOfTheKeys) {
  at::manual_seed(3);
  const at::Tensor k = at::randn({1, 2, 30, 8}, at::kDouble);
  const at::Tensor v = at::randn({1, 2, 30, 8}, at::kDouble);
  // One query is the last position: it sees every key, as without the mask.
  const at::Tensor one = at::randn({1, 2, 1, 8}, at::kDouble);
  EXPECT_TRUE(at::allclose(onlineSoftmaxAttentionCpu(one, k, v, 7, true, 0.5).out,
                           onlineSoftmaxAttentionCpu(one, k, v, 7, false, 0.5).out, 1e-12, 1e-14));
  // With Tq == Tk the first query sees key 0 alone: its output is v[0] and its lse its score.
  const at::Tensor q = at::randn({1, 2, 30, 8}, at::kDouble);
  const AttentionResult r = onlineSoftmaxAttentionCpu(q, k, v, 7, true, 0.5);
  const at::Tensor first = r.out.select(2, 0), v0 = v.select(2, 0);
  EXPECT_TRUE(at::allclose(first, v0, 1e-12, 1e-14)) << first << v0;
  const at::Tensor score0 = (q.select(2, 0) * k.select(2, 0)).sum(-1) * 0.5;
  EXPECT_TRUE(at::allclose(r.lse.select(2, 0), score0.to(at::kFloat), 1e-6, 1e-6));
}

TEST(OnlineSoftmaxAttention, RowsThatSeeNoKeyGiveZeroAndMinusInfinityLse) {
  const at::Tensor q = at::randn({1, 1, 6, 4}), k = at::randn({1, 1, 2, 4});
  const AttentionResult r = onlineSoftmaxAttentionCpu(q, k, k, 1, true, 1.0);
  // Queries 0..3 are positions -4..-1 of a 2-key sequence.
  EXPECT_TRUE(at::equal(r.out.narrow(2, 0, 4), at::zeros({1, 1, 4, 4})));
  EXPECT_TRUE(r.lse.narrow(2, 0, 4).isneginf().all().item<bool>());
  EXPECT_TRUE(at::isfinite(r.lse.narrow(2, 4, 2)).all().item<bool>());
  const AttentionResult none =
      onlineSoftmaxAttentionCpu(q, k.narrow(2, 0, 0), k.narrow(2, 0, 0), 4, false, 1.0);
  EXPECT_TRUE(at::equal(none.out, at::zeros_like(q)));
  EXPECT_TRUE(none.lse.isneginf().all().item<bool>());
}

TEST(OnlineSoftmaxAttention, BFloat16InputsGiveBFloat16OutputAndFloat32Lse) {
  at::manual_seed(4);
  const at::Tensor q = at::randn({2, 2, 45, 32}).to(at::kBFloat16);
  const at::Tensor k = at::randn({2, 2, 70, 32}).to(at::kBFloat16);
  const at::Tensor v = at::randn({2, 2, 70, 32}).to(at::kBFloat16);
  const AttentionResult got = onlineSoftmaxAttentionCpu(q, k, v, 16, true, 0.2);
  const AttentionResult want = referenceAttention(q, k, v, true, 0.2);
  ASSERT_EQ(got.out.scalar_type(), at::kBFloat16);
  ASSERT_EQ(got.lse.scalar_type(), at::kFloat);
  // The reference starts from the same bfloat16 numbers, so what differs is float32 arithmetic
  // (~1e-5, see the sweep) and the rounding of out to bfloat16, half an ulp: 2^-9 relative.
  // 2^-8 relative and 1e-4 absolute cover both.
  const ErrorStats out = errorStatsCpu(got.out, want.out, 1.0 / 256, 1e-4, false);
  EXPECT_EQ(out.mismatches, 0) << describe(out);
  const ErrorStats lse = errorStatsCpu(got.lse, want.lse, 0, 1e-5, false);
  EXPECT_EQ(lse.mismatches, 0) << describe(lse);
}

TEST(OnlineSoftmaxAttention, TheDispatcherWalksOnTheCpuForCpuTensors) {
  const at::Tensor q = at::randn({1, 2, 9, 8}), k = at::randn({1, 2, 11, 8});
  const AttentionResult a = onlineSoftmaxAttention(q, k, k, 4, true, 0.3);
  const AttentionResult b = onlineSoftmaxAttentionCpu(q, k, k, 4, true, 0.3);
  EXPECT_TRUE(at::equal(a.out, b.out));
  EXPECT_TRUE(at::equal(a.lse, b.lse));
}

TEST(OnlineSoftmaxAttention, BadShapesDtypesAndChunksAreRefused) {
  const at::Tensor q = at::randn({1, 2, 9, 8}), k = at::randn({1, 2, 11, 8});
  EXPECT_THROW(onlineSoftmaxAttentionCpu(q, k, k, 0, false, 1.0), c10::Error);
  EXPECT_THROW(onlineSoftmaxAttentionCpu(q, k, k.narrow(2, 0, 10), 4, false, 1.0), c10::Error);
  EXPECT_THROW(onlineSoftmaxAttentionCpu(q, k.narrow(3, 0, 4), k.narrow(3, 0, 4), 4, false, 1.0),
               c10::Error);
  EXPECT_THROW(onlineSoftmaxAttentionCpu(q, k.to(at::kDouble), k, 4, false, 1.0), c10::Error);
  EXPECT_THROW(onlineSoftmaxAttentionCpu(q.select(0, 0), k, k, 4, false, 1.0), c10::Error);
}

// ---------------------------------------------------------------------------------------------
// The backward walk against autograd through the whole softmax in float64.

struct Grads {
  at::Tensor dq, dk, dv;
};

Grads referenceGrads(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const at::Tensor& dout, bool causal, double scale) {
  const at::Tensor qd = q.to(at::kDouble).requires_grad_(true);
  const at::Tensor kd = k.to(at::kDouble).requires_grad_(true);
  const at::Tensor vd = v.to(at::kDouble).requires_grad_(true);
  at::Tensor scores = at::matmul(qd, kd.transpose(-2, -1)) * scale;
  if (causal) scores = scores.masked_fill(causalMask(q.size(2), k.size(2)), -kInf);
  const at::Tensor out = at::matmul(at::softmax(scores, -1).nan_to_num(0.0), vd);
  const auto g = torch::autograd::grad({out}, {qd, kd, vd}, {dout.to(at::kDouble)});
  return {g[0], g[1], g[2]};
}

// The planted fault: the backward walk without delta (ds = p * dp), the softmax's Jacobian
// missing its rank-one term, in float64.
Grads backwardWithoutDelta(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& lse, const at::Tensor& dout, int64_t keyChunk,
                           double scale) {
  const at::Tensor scaledQ = q * scale;
  Grads g{at::zeros_like(q), at::zeros_like(k), at::zeros_like(v)};
  for (int64_t start = 0; start < k.size(2); start += keyChunk) {
    const int64_t len = std::min(keyChunk, k.size(2) - start);
    const at::Tensor keys = k.narrow(2, start, len), values = v.narrow(2, start, len);
    const at::Tensor p = (at::matmul(scaledQ, keys.transpose(-2, -1)) - lse.unsqueeze(-1)).exp();
    g.dv.narrow(2, start, len).copy_(at::matmul(p.transpose(-2, -1), dout));
    const at::Tensor ds = at::matmul(dout, values.transpose(-2, -1)) * p;
    g.dq.add_(at::matmul(ds, keys), scale);
    g.dk.narrow(2, start, len).copy_(at::matmul(ds.transpose(-2, -1), scaledQ));
  }
  return g;
}

class OnlineSoftmaxAttentionBackwardSweep
    : public ::testing::TestWithParam<std::tuple<Shape, bool, at::ScalarType>> {};

// Tolerances: the gradients are sums over the keys (dq) or the queries (dk, dv) of products of
// O(1) numbers, taken in another order and through p recomputed from lse; over this sweep the
// worst float32 error is 8.8e-7 absolute (float64 1.2e-15). float32 4e-6 and 4e-6, float64
// 1e-14 and 1e-14 leave 4.5x and 8x room; a backward without delta is off by O(1)
// (ForgettingDeltaFailsTheSameComparison).
TEST_P(OnlineSoftmaxAttentionBackwardSweep, MatchesAutogradThroughTheWholeSoftmax) {
  const auto& [shape, causal, dtype] = GetParam();
  at::manual_seed(5);
  const at::Tensor q = at::randn({shape.b, shape.h, shape.tq, shape.d}, dtype);
  const at::Tensor k = at::randn({shape.b, shape.h, shape.tk, shape.d}, dtype);
  const at::Tensor v = at::randn({shape.b, shape.h, shape.tk, shape.d}, dtype);
  const at::Tensor dout = at::randn({shape.b, shape.h, shape.tq, shape.d}, dtype);
  const double scale = 1.0 / std::sqrt(static_cast<double>(shape.d));

  const AttentionResult fwd =
      onlineSoftmaxAttentionForTraining(q, k, v, shape.keyChunk, causal, scale);
  ASSERT_EQ(fwd.lse.scalar_type(), dtype);  // the walk's own dtype, for the backward
  const AttentionGrads got = onlineSoftmaxAttentionBackward(q, k, v, fwd.out, fwd.lse, dout,
                                                            shape.keyChunk, causal, scale);
  const Grads want = referenceGrads(q, k, v, dout, causal, scale);
  const double tol = dtype == at::kFloat ? 4e-6 : 1e-14;
  for (const auto& [name, a, b] :
       {std::tuple<const char*, at::Tensor, at::Tensor>{"dq", got.dq, want.dq},
        {"dk", got.dk, want.dk},
        {"dv", got.dv, want.dv}}) {
    ASSERT_EQ(a.scalar_type(), dtype) << name;
    ASSERT_EQ(a.sizes(), b.sizes()) << name;
    const ErrorStats e = errorStatsCpu(a, b, tol, tol, false);
    EXPECT_EQ(e.mismatches, 0) << name << ": " << describe(e);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, OnlineSoftmaxAttentionBackwardSweep,
                         ::testing::Combine(::testing::ValuesIn(kShapes), ::testing::Bool(),
                                            ::testing::Values(at::kFloat, at::kDouble)),
                         sweepName);

TEST(OnlineSoftmaxAttentionBackward, ForgettingDeltaFailsTheSameComparison) {
  at::manual_seed(6);
  const at::Tensor q = at::randn({2, 2, 40, 16}, at::kDouble);
  const at::Tensor k = at::randn({2, 2, 100, 16}, at::kDouble);
  const at::Tensor v = at::randn({2, 2, 100, 16}, at::kDouble);
  const at::Tensor dout = at::randn({2, 2, 40, 16}, at::kDouble);
  const double scale = 0.25;
  const Grads want = referenceGrads(q, k, v, dout, false, scale);
  const AttentionResult fwd = onlineSoftmaxAttentionForTraining(q, k, v, 8, false, scale);
  const AttentionGrads right =
      onlineSoftmaxAttentionBackward(q, k, v, fwd.out, fwd.lse, dout, 8, false, scale);
  EXPECT_EQ(errorStatsCpu(right.dq, want.dq, 1e-14, 1e-14, false).mismatches, 0);
  const Grads wrong = backwardWithoutDelta(q, k, v, fwd.lse, dout, 8, scale);
  // dv does not involve delta; dq and dk are off nearly everywhere.
  EXPECT_EQ(errorStatsCpu(wrong.dv, want.dv, 1e-14, 1e-14, false).mismatches, 0);
  for (const auto& [name, a, b] :
       {std::tuple<const char*, at::Tensor, at::Tensor>{"dq", wrong.dq, want.dq},
        {"dk", wrong.dk, want.dk}}) {
    const ErrorStats bad = errorStatsCpu(a, b, 1e-14, 1e-14, false);
    EXPECT_GT(bad.mismatches, bad.numel / 2) << name << ": " << describe(bad);
    EXPECT_GT(bad.maxAbsErr, 1e-2) << name << ": " << describe(bad);
  }
}

// Rows that see no key (causal, more queries than keys) get zero gradients, not NaN; bfloat16
// inputs get bfloat16 gradients computed in float32.
TEST(OnlineSoftmaxAttentionBackward, RowsWithoutKeysAndBFloat16) {
  at::manual_seed(7);
  const at::Tensor q = at::randn({1, 2, 6, 4}), k = at::randn({1, 2, 2, 4});
  const at::Tensor dout = at::randn({1, 2, 6, 4});
  const AttentionResult fwd = onlineSoftmaxAttentionForTraining(q, k, k, 1, true, 1.0);
  const AttentionGrads g =
      onlineSoftmaxAttentionBackward(q, k, k, fwd.out, fwd.lse, dout, 1, true, 1.0);
  EXPECT_TRUE(at::equal(g.dq.narrow(2, 0, 4), at::zeros({1, 2, 4, 4})));
  EXPECT_TRUE(at::isfinite(g.dq).all().item<bool>() && at::isfinite(g.dk).all().item<bool>());

  const at::Tensor qb = at::randn({2, 2, 45, 32}).to(at::kBFloat16);
  const at::Tensor kb = at::randn({2, 2, 70, 32}).to(at::kBFloat16);
  const at::Tensor vb = at::randn({2, 2, 70, 32}).to(at::kBFloat16);
  const at::Tensor db = at::randn({2, 2, 45, 32}).to(at::kBFloat16);
  const AttentionResult fb = onlineSoftmaxAttentionForTraining(qb, kb, vb, 16, true, 0.2);
  ASSERT_EQ(fb.lse.scalar_type(), at::kFloat);
  const AttentionGrads gb =
      onlineSoftmaxAttentionBackward(qb, kb, vb, fb.out, fb.lse, db, 16, true, 0.2);
  ASSERT_EQ(gb.dq.scalar_type(), at::kBFloat16);
  const Grads want = referenceGrads(qb, kb, vb, db, true, 0.2);
  // float32 arithmetic from bfloat16 inputs, out rounded to bfloat16 before delta, and each
  // gradient rounded to bfloat16 (worst seen 4e-3 absolute): 2^-7 relative and 2e-2 absolute.
  for (const auto& [name, a, b] :
       {std::tuple<const char*, at::Tensor, at::Tensor>{"dq", gb.dq, want.dq},
        {"dk", gb.dk, want.dk},
        {"dv", gb.dv, want.dv}}) {
    const ErrorStats e = errorStatsCpu(a, b, 1.0 / 128, 2e-2, false);
    EXPECT_EQ(e.mismatches, 0) << name << ": " << describe(e);
  }
}

}  // namespace
}  // namespace sb::kernels

namespace sb::kernels {
namespace {

// The block API (what context parallelism walks) against the walk itself: the same blocks in
// the same order give the same bits, causal and not; a block order reversed does not, so the
// comparison can fail. A subset of the query rows (one rank's) is close but not bitwise: this
// LibTorch's BLAS picks its kernel, and with it the order of a product's sums, by the number of
// rows (rows of a @ b are not the rows of a[rows] @ b), so context parallelism's outputs cannot
// be the single-rank walk's bits on it.
TEST(OnlineSoftmaxBlocks, TheSameBlocksInTheSameOrderAreTheWalksBits) {
  at::manual_seed(9);
  const int64_t B = 2, H = 4, T = 64, D = 16, chunk = 16;
  const at::Tensor q = at::randn({B, H, T, D}), k = at::randn({B, H, T, D}),
                   v = at::randn({B, H, T, D}), dout = at::randn({B, H, T, D});
  const double scale = 0.25;
  const at::Tensor pos = at::arange(T, at::kLong);
  for (bool causal : {false, true}) {
    const AttentionResult whole = onlineSoftmaxAttentionForTraining(q, k, v, chunk, causal, scale);
    const AttentionGrads grads =
        onlineSoftmaxAttentionBackward(q, k, v, whole.out, whole.lse, dout, chunk, causal, scale);
    // Rows [32, 48): one rank's queries.
    for (const auto& [begin, rows] : {std::pair<int64_t, int64_t>{0, T}, {32, 16}}) {
      const at::Tensor qr = q.narrow(2, begin, rows), qpos = pos.narrow(0, begin, rows);
      OnlineSoftmaxBlocks fwd(qr, scale);
      for (int64_t s = 0; s < T; s += chunk) {
        const at::Tensor mask =
            causal ? maskByPosition(qpos, pos.narrow(0, s, chunk)) : at::Tensor();
        fwd.add(k.narrow(2, s, chunk), v.narrow(2, s, chunk), mask);
      }
      const AttentionResult got = fwd.finish();
      if (rows != T) {
        EXPECT_TRUE(at::allclose(got.out, whole.out.narrow(2, begin, rows), 1e-5, 1e-6));
        EXPECT_TRUE(at::allclose(got.lse, whole.lse.narrow(2, begin, rows), 1e-5, 1e-6));
        continue;
      }
      EXPECT_TRUE(at::equal(got.out, whole.out)) << causal;
      EXPECT_TRUE(at::equal(got.lse, whole.lse)) << causal;
      OnlineSoftmaxBackwardBlocks bwd(q, whole.out, whole.lse, dout, scale);
      for (int64_t s = 0; s < T; s += chunk) {
        const at::Tensor mask =
            causal ? maskByPosition(pos, pos.narrow(0, s, chunk)) : at::Tensor();
        const auto [dk, dv] = bwd.add(k.narrow(2, s, chunk), v.narrow(2, s, chunk), mask);
        EXPECT_TRUE(at::equal(dk, grads.dk.narrow(2, s, chunk))) << causal << " block " << s;
        EXPECT_TRUE(at::equal(dv, grads.dv.narrow(2, s, chunk))) << causal << " block " << s;
      }
      EXPECT_TRUE(at::equal(bwd.dq(), grads.dq)) << causal;
    }
    OnlineSoftmaxBlocks reversed(q, scale);
    for (int64_t s = T - chunk; s >= 0; s -= chunk) {
      const at::Tensor mask = causal ? maskByPosition(pos, pos.narrow(0, s, chunk)) : at::Tensor();
      reversed.add(k.narrow(2, s, chunk), v.narrow(2, s, chunk), mask);
    }
    EXPECT_FALSE(at::equal(reversed.finish().out, whole.out)) << causal;
  }
}

}  // namespace
}  // namespace sb::kernels
