#pragma once

// Scaled dot-product attention, forward, by online softmax (FlashAttention's recurrence): the
// keys are walked a block at a time, and each query row keeps a running maximum m of its scores,
// a running denominator l = sum exp(score - m) and an unnormalised output acc = sum exp(score -
// m) v. When a block raises the maximum from m_old to m_new, l and acc are first multiplied by
// exp(m_old - m_new), so that every term is relative to the same maximum; at the end out = acc /
// l and lse = m + log l. The full Tq x Tk score matrix never exists: only one block of it.
//
// On CPU (onlineSoftmaxAttentionCpu) each block is one ATen matmul per step; on a CUDA tensor
// the kernel of kernels/attention.cu does the same per tile of queries and keys in shared memory.
// The CPU implementation is the reference the kernel is tested against.

#include <cstdint>

#include <ATen/core/Tensor.h>

namespace sb::kernels {

struct AttentionResult {
  at::Tensor out;  // [B, H, Tq, D], q's dtype
  // [B, H, Tq], float32 whatever the inputs: log sum_j exp(scale * q_i . k_j) over the keys row
  // i sees, what a backward pass or a merge of partial attentions over key shards needs.
  at::Tensor lse;
};

// softmax(scale * q k^T [causal mask]) v for q [B, H, Tq, D] and k, v [B, H, Tk, D] of one
// floating dtype on one device, walking the keys `keyChunk` (>= 1) at a time; the temporaries
// are O(B * H * Tq * keyChunk). Arithmetic is in float32 for float16 and bfloat16 inputs and in
// the input dtype otherwise; `out` is rounded back to the input dtype.
//
// Causal: the queries are the last Tq of the Tk positions, so query i sees keys
// j <= i + (Tk - Tq) (with Tq == Tk, the usual lower triangle). Where Tq > Tk the first Tq - Tk
// rows see no key: their output is 0 and their lse -inf. Throws (c10::Error) for other shapes,
// mixed dtypes or devices, and keyChunk < 1.
AttentionResult onlineSoftmaxAttentionCpu(const at::Tensor& q, const at::Tensor& k,
                                          const at::Tensor& v, int64_t keyChunk, bool causal,
                                          double scale);

// Dispatches on the device: the CUDA kernel where built and the tensors live on a GPU (float32
// or bfloat16, D <= 128, else throws; its key tile is its own, so keyChunk only matters to the
// CPU walk and the results agree to rounding), the CPU implementation otherwise.
AttentionResult onlineSoftmaxAttention(const at::Tensor& q, const at::Tensor& k,
                                       const at::Tensor& v, int64_t keyChunk, bool causal,
                                       double scale);

// For training: onlineSoftmaxAttention, but on the CPU `lse` stays in the walk's arithmetic
// dtype (float64 for float64 inputs; float32 otherwise, as the kernel's), since the backward
// recomputes every block's probabilities from it and a float32 lse would round float64's.
AttentionResult onlineSoftmaxAttentionForTraining(const at::Tensor& q, const at::Tensor& k,
                                                  const at::Tensor& v, int64_t keyChunk,
                                                  bool causal, double scale);

struct AttentionGrads {
  at::Tensor dq, dk, dv;  // shaped and typed as q, k and v
};

// The backward of the attention above (FlashAttention's): the keys walked `keyChunk` at a time
// again, each block's probabilities recomputed from the saved lse, p = exp(scale q k^T - lse),
// never the whole [Tq, Tk] matrix. With delta = rowsum(dout * out):
//   dv_block = p^T dout,  ds = p * (dout v_block^T - delta),  dq += scale ds k_block,
//   dk_block = scale ds^T q.
// ATen products on whatever device the tensors are (no CUDA kernel: on a GPU it is the same
// walk in cuBLAS products). `out` and `lse` are the forward's; rows that saw no key (lse -inf)
// get zero gradients. Arithmetic in float32 for half types, in the input dtype otherwise.
AttentionGrads onlineSoftmaxAttentionBackward(const at::Tensor& q, const at::Tensor& k,
                                              const at::Tensor& v, const at::Tensor& out,
                                              const at::Tensor& lse, const at::Tensor& dout,
                                              int64_t keyChunk, bool causal, double scale);

// The dtype the walks' arithmetic runs in: float32 for float16 and bfloat16, the input's
// otherwise.
at::ScalarType attentionMathType(at::ScalarType input);

// The walks above a key block at a time, for callers whose key blocks arrive from elsewhere
// (context parallelism: a ring of ranks, or keys gathered from every rank) and whose queries
// and keys sit at arbitrary sequence positions. The arithmetic is the CPU walk's, op for op,
// so the same blocks in the same order give bitwise the same out, lse and gradients
// (kernels/test/attention_test.cpp holds them to it). The walks do not call them: the chunking
// estimator replays the walks' allocations in their order (a block's mask after its scores),
// which a shared body would change.
//
// `masked`: [Tq, len] bool, true where the query may not see the key (maskByPosition), or an
// undefined tensor for none.
at::Tensor maskByPosition(const at::Tensor& queryPos, const at::Tensor& keyPos);

class OnlineSoftmaxBlocks {
 public:
  OnlineSoftmaxBlocks(const at::Tensor& q, double scale);
  // Folds one key block ([B, H, len, D] keys and values) into every query row's state.
  void add(const at::Tensor& k, const at::Tensor& v, const at::Tensor& masked);
  // out in q's dtype, lse in the arithmetic's dtype (as onlineSoftmaxAttentionForTraining).
  AttentionResult finish();

 private:
  at::ScalarType input_, math_;
  at::Tensor scaledQ_, m_, l_, acc_;
};

class OnlineSoftmaxBackwardBlocks {
 public:
  // q, out, lse and dout of the query rows, as onlineSoftmaxAttentionBackward takes them.
  OnlineSoftmaxBackwardBlocks(const at::Tensor& q, const at::Tensor& out, const at::Tensor& lse,
                              const at::Tensor& dout, double scale);
  // One key block: adds its share to dq and returns the block's dk and dv from these query
  // rows, in the arithmetic's dtype.
  std::pair<at::Tensor, at::Tensor> add(const at::Tensor& k, const at::Tensor& v,
                                        const at::Tensor& masked);
  at::Tensor dq() const;  // in q's dtype

 private:
  at::ScalarType input_, math_;
  double scale_;
  at::Tensor scaledQ_, dO_, delta_, shift_, dq_;
};

}  // namespace sb::kernels
