#include "kernels/attention.h"

#include <algorithm>
#include <limits>
#include <vector>

#include <ATen/ATen.h>

#include "kernels/cuda_api.h"
#include "kernels/stream.h"

namespace sb::kernels {
namespace {

void checkInputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
              "attention: q, k and v must be [B, H, T, D], got ", q.sizes(), ", ", k.sizes(),
              " and ", v.sizes());
  TORCH_CHECK(k.sizes() == v.sizes(), "attention: k and v must have one shape, got ", k.sizes(),
              " and ", v.sizes());
  TORCH_CHECK(q.size(0) == k.size(0) && q.size(1) == k.size(1) && q.size(3) == k.size(3),
              "attention: q ", q.sizes(), " and k ", k.sizes(), " differ in B, H or D");
  TORCH_CHECK(at::isFloatingType(q.scalar_type()) && q.scalar_type() == k.scalar_type() &&
                  q.scalar_type() == v.scalar_type(),
              "attention: q, k and v must have one floating dtype, got ", q.scalar_type(), ", ",
              k.scalar_type(), " and ", v.scalar_type());
  TORCH_CHECK(q.device() == k.device() && q.device() == v.device(),
              "attention: q, k and v must be on one device, got ", q.device(), ", ", k.device(),
              " and ", v.device());
}

// The last key each query row sees: the queries are the last tq of the tk positions.
at::Tensor lastKeys(int64_t tq, int64_t tk, const at::TensorOptions& options) {
  return at::arange(tq, options.dtype(at::kLong)).add_(tk - tq).unsqueeze(1);
}

// One key block of a walk: its keys and values in the arithmetic's dtype (views where that is
// theirs) and its scores scaledQ k^T [B, H, tq, len], -inf where a causal query may not look.
struct KeyBlock {
  at::Tensor keys, values, scores;
};
KeyBlock keyBlock(const at::Tensor& scaledQ, const at::Tensor& k, const at::Tensor& v,
                  int64_t start, int64_t len, at::ScalarType math, bool causal,
                  const at::Tensor& lastKey) {
  KeyBlock b;
  b.keys = k.narrow(2, start, len).to(math);
  b.values = v.narrow(2, start, len).to(math);
  b.scores = at::matmul(scaledQ, b.keys.transpose(-2, -1));
  if (causal) {
    const at::Tensor key = at::arange(start, start + len, lastKey.options());
    b.scores.masked_fill_(key.gt(lastKey), -std::numeric_limits<double>::infinity());
  }
  return b;
}

// The walk; lse in the arithmetic's dtype.
AttentionResult walk(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     int64_t keyChunk, bool causal, double scale) {
  checkInputs(q, k, v);
  TORCH_CHECK(keyChunk >= 1, "attention: keyChunk must be at least 1, got ", keyChunk);
  const int64_t tq = q.size(2), tk = k.size(2);
  const at::ScalarType input = q.scalar_type();
  const at::ScalarType math = attentionMathType(input);
  const double inf = std::numeric_limits<double>::infinity();

  const at::Tensor scaledQ = q.to(math) * scale;
  const std::vector<int64_t> rowShape = {q.size(0), q.size(1), tq, 1};
  at::Tensor m = at::full(rowShape, -inf, scaledQ.options());  // running row maximum
  at::Tensor l = at::zeros(rowShape, scaledQ.options());       // running sum of exp(score - m)
  at::Tensor acc = at::zeros_like(scaledQ);                    // running sum of exp(score - m) v
  const at::Tensor lastKey = lastKeys(tq, tk, q.options());

  for (int64_t start = 0; start < tk; start += keyChunk) {
    const int64_t len = std::min(keyChunk, tk - start);
    const KeyBlock block = keyBlock(scaledQ, k, v, start, len, math, causal, lastKey);
    const at::Tensor &values = block.values, &scores = block.scores;
    const at::Tensor mNew = at::maximum(m, scores.amax(-1, /*keepdim=*/true));
    // A row that has seen no key yet has m_new = -inf, and exp(-inf - -inf) is NaN: such a row
    // subtracts 0 instead, which turns its masked scores and its empty past into exp(-inf) = 0.
    const at::Tensor shift = at::where(mNew.isneginf(), at::zeros_like(mNew), mNew);
    const at::Tensor p = (scores - shift).exp_();
    const at::Tensor rescale = (m - shift).exp_();  // exp(m_old - m_new)
    l.mul_(rescale).add_(p.sum(-1, /*keepdim=*/true));
    acc.mul_(rescale).add_(at::matmul(p, values));
    m = mNew;
  }

  // A row that saw no key (causal, tq > tk) has l = 0 and acc = 0: output 0, lse -inf.
  AttentionResult r;
  r.out = acc.div_(at::where(l.eq(0), at::ones_like(l), l)).to(input);
  r.lse = (m + l.log()).squeeze(-1);
  return r;
}

}  // namespace

at::ScalarType attentionMathType(at::ScalarType input) {
  return (input == at::kHalf || input == at::kBFloat16) ? at::kFloat : input;
}

AttentionResult onlineSoftmaxAttentionCpu(const at::Tensor& q, const at::Tensor& k,
                                          const at::Tensor& v, int64_t keyChunk, bool causal,
                                          double scale) {
  AttentionResult r = walk(q, k, v, keyChunk, causal, scale);
  r.lse = r.lse.to(at::kFloat);
  return r;
}

AttentionResult onlineSoftmaxAttentionForTraining(const at::Tensor& q, const at::Tensor& k,
                                                  const at::Tensor& v, int64_t keyChunk,
                                                  bool causal, double scale) {
  if (q.is_cuda()) return onlineSoftmaxAttention(q, k, v, keyChunk, causal, scale);
  return walk(q, k, v, keyChunk, causal, scale);
}

AttentionGrads onlineSoftmaxAttentionBackward(const at::Tensor& q, const at::Tensor& k,
                                              const at::Tensor& v, const at::Tensor& out,
                                              const at::Tensor& lse, const at::Tensor& dout,
                                              int64_t keyChunk, bool causal, double scale) {
  checkInputs(q, k, v);
  TORCH_CHECK(keyChunk >= 1, "attention backward: keyChunk must be at least 1, got ", keyChunk);
  TORCH_CHECK(out.sizes() == q.sizes() && dout.sizes() == q.sizes(), "attention backward: out ",
              out.sizes(), " and dout ", dout.sizes(), " must be shaped as q ", q.sizes());
  TORCH_CHECK(lse.dim() == 3 && lse.sizes() == q.sizes().slice(0, 3),
              "attention backward: lse must be [B, H, Tq] = ", q.sizes().slice(0, 3), ", got ",
              lse.sizes());
  const int64_t tq = q.size(2), tk = k.size(2);
  const at::ScalarType input = q.scalar_type();
  const at::ScalarType math = attentionMathType(input);

  const at::Tensor scaledQ = q.to(math) * scale;
  const at::Tensor dO = dout.to(math);
  // delta_i = sum_d dout_id out_id, which every block's ds subtracts.
  const at::Tensor delta = (dO * out.to(math)).sum(-1, /*keepdim=*/true);
  // A row that saw no key has lse -inf and every score -inf: subtracting 0 makes its p 0.
  const at::Tensor rowLse = lse.to(math).unsqueeze(-1);
  const at::Tensor shift = at::where(rowLse.isneginf(), at::zeros_like(rowLse), rowLse);
  at::Tensor dq = at::zeros_like(scaledQ);
  at::Tensor dk = at::empty(k.sizes(), scaledQ.options());
  at::Tensor dv = at::empty(v.sizes(), scaledQ.options());
  const at::Tensor lastKey = lastKeys(tq, tk, q.options());

  for (int64_t start = 0; start < tk; start += keyChunk) {
    const int64_t len = std::min(keyChunk, tk - start);
    KeyBlock block = keyBlock(scaledQ, k, v, start, len, math, causal, lastKey);
    const at::Tensor &keys = block.keys, &values = block.values;
    at::Tensor& scores = block.scores;
    const at::Tensor p = scores.sub_(shift).exp_();  // the block's probabilities, in place
    dv.narrow(2, start, len).copy_(at::matmul(p.transpose(-2, -1), dO));
    const at::Tensor ds = at::matmul(dO, values.transpose(-2, -1)).sub_(delta).mul_(p);
    dq.add_(at::matmul(ds, keys), scale);
    dk.narrow(2, start, len).copy_(at::matmul(ds.transpose(-2, -1), scaledQ));
  }
  return {dq.to(input), dk.to(input), dv.to(input)};
}

// The block API: walk()'s and onlineSoftmaxAttentionBackward()'s loop bodies, op for op (kept
// in step with them; attention_test.cpp compares them bitwise).

at::Tensor maskByPosition(const at::Tensor& queryPos, const at::Tensor& keyPos) {
  return keyPos.unsqueeze(0).gt(queryPos.unsqueeze(1));
}

OnlineSoftmaxBlocks::OnlineSoftmaxBlocks(const at::Tensor& q, double scale)
    : input_(q.scalar_type()), math_(attentionMathType(q.scalar_type())) {
  const double inf = std::numeric_limits<double>::infinity();
  scaledQ_ = q.to(math_) * scale;
  const std::vector<int64_t> rowShape = {q.size(0), q.size(1), q.size(2), 1};
  m_ = at::full(rowShape, -inf, scaledQ_.options());
  l_ = at::zeros(rowShape, scaledQ_.options());
  acc_ = at::zeros_like(scaledQ_);
}

void OnlineSoftmaxBlocks::add(const at::Tensor& k, const at::Tensor& v, const at::Tensor& masked) {
  const at::Tensor keys = k.to(math_), values = v.to(math_);
  at::Tensor scores = at::matmul(scaledQ_, keys.transpose(-2, -1));
  if (masked.defined()) scores.masked_fill_(masked, -std::numeric_limits<double>::infinity());
  const at::Tensor mNew = at::maximum(m_, scores.amax(-1, /*keepdim=*/true));
  const at::Tensor shift = at::where(mNew.isneginf(), at::zeros_like(mNew), mNew);
  const at::Tensor p = (scores - shift).exp_();
  const at::Tensor rescale = (m_ - shift).exp_();
  l_.mul_(rescale).add_(p.sum(-1, /*keepdim=*/true));
  acc_.mul_(rescale).add_(at::matmul(p, values));
  m_ = mNew;
}

AttentionResult OnlineSoftmaxBlocks::finish() {
  AttentionResult r;
  r.out = acc_.div_(at::where(l_.eq(0), at::ones_like(l_), l_)).to(input_);
  r.lse = (m_ + l_.log()).squeeze(-1);
  return r;
}

OnlineSoftmaxBackwardBlocks::OnlineSoftmaxBackwardBlocks(const at::Tensor& q, const at::Tensor& out,
                                                         const at::Tensor& lse,
                                                         const at::Tensor& dout, double scale)
    : input_(q.scalar_type()), math_(attentionMathType(q.scalar_type())), scale_(scale) {
  scaledQ_ = q.to(math_) * scale;
  dO_ = dout.to(math_);
  delta_ = (dO_ * out.to(math_)).sum(-1, /*keepdim=*/true);
  const at::Tensor rowLse = lse.to(math_).unsqueeze(-1);
  shift_ = at::where(rowLse.isneginf(), at::zeros_like(rowLse), rowLse);
  dq_ = at::zeros_like(scaledQ_);
}

std::pair<at::Tensor, at::Tensor> OnlineSoftmaxBackwardBlocks::add(const at::Tensor& k,
                                                                   const at::Tensor& v,
                                                                   const at::Tensor& masked) {
  const at::Tensor keys = k.to(math_), values = v.to(math_);
  at::Tensor scores = at::matmul(scaledQ_, keys.transpose(-2, -1));
  if (masked.defined()) scores.masked_fill_(masked, -std::numeric_limits<double>::infinity());
  const at::Tensor p = scores.sub_(shift_).exp_();
  at::Tensor dv = at::matmul(p.transpose(-2, -1), dO_);
  const at::Tensor ds = at::matmul(dO_, values.transpose(-2, -1)).sub_(delta_).mul_(p);
  dq_.add_(at::matmul(ds, keys), scale_);
  at::Tensor dk = at::matmul(ds.transpose(-2, -1), scaledQ_);
  return {dk, dv};
}

at::Tensor OnlineSoftmaxBackwardBlocks::dq() const { return dq_.to(input_); }

AttentionResult onlineSoftmaxAttention(const at::Tensor& q, const at::Tensor& k,
                                       const at::Tensor& v, int64_t keyChunk, bool causal,
                                       double scale) {
#ifdef SB_HAVE_CUDA_KERNELS
  if (q.is_cuda()) {
    checkInputs(q, k, v);
    TORCH_CHECK(q.scalar_type() == at::kFloat || q.scalar_type() == at::kBFloat16,
                "attention: the CUDA kernel takes float32 or bfloat16, got ", q.scalar_type());
    const at::Tensor qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous();
    AttentionResult r;
    r.out = at::empty_like(qc);
    r.lse = at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(at::kFloat));
    cuda::attentionForward(
        qc.data_ptr(), kc.data_ptr(), vc.data_ptr(), r.out.data_ptr(), r.lse.data_ptr<float>(),
        q.scalar_type() == at::kFloat ? cuda::Dtype::kFloat32 : cuda::Dtype::kBFloat16,
        q.size(0) * q.size(1), q.size(2), k.size(2), q.size(3), causal, scale, currentStream(q));
    return r;
  }
#endif
  return onlineSoftmaxAttentionCpu(q, k, v, keyChunk, causal, scale);
}

}  // namespace sb::kernels
