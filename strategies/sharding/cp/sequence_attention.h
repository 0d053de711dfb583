#pragma once

// Attention over a sequence sharded across the ranks of one mesh axis: the core of
// sharding/cp (context_parallel.cpp), which runs everything else of the transformer on the
// shards. One object per rank; it knows which positions every rank holds and walks the other
// ranks' keys and values through the axis' Communicator:
//
//   ring/p2p        each rank keeps its queries and passes its keys and values around the ring
//                   (w - 1 steps), folding each block into the online softmax
//                   (kernels::OnlineSoftmaxBlocks); the backward passes the keys and values
//                   around again with their gradients' running sums, which take one more step
//                   home to their owner (w - 1 exchanges of k, v, dk, dv, then one of dk, dv)
//   ring/allgather  keys and values all-gathered once (Llama 3's variant) and kept for the
//                   backward, walked in position order in blocks of T / w; their gradients
//                   reduce-scattered back to their owners
//   ulysses         DeepSpeed-Ulysses: one all-to-all turns sequence shards of q, k and v into
//                   head shards (heads / w heads over the whole sequence), attention runs whole
//                   per head, a second all-to-all turns the output back; the backward mirrors
//                   both (harness/comm/autograd_comm.h)
//
// Causal masks come from positions, so a load-balanced layout (rank r holding chunks r and
// 2w - 1 - r of 2w) masks as the whole sequence does; blocks wholly above the diagonal are
// skipped. The masks, and which blocks are visible, are fixed by the layout: made once here,
// not in every step.

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "harness/comm/comm.h"
#include "kernels/attention.h"

namespace sb::strategies::cp {

enum class Variant { kRingP2P, kRingAllGather, kUlysses };

// Deliberate bugs for the planted-fault tests (context_parallel.cpp says what each does).
enum class Fault {
  kNone,
  kStaleKv,
  kDkvNotReturned,
  kMaskIgnoresBalance,
  kUlyssesSwapped,
  kTpInputGradUnsummed
};

const char* variantId(Variant v);  // "ring/p2p", "ring/allgather", "ulysses"
const char* faultName(Fault f);    // "stale_kv", ...

// Which sequence positions each rank of the axis holds.
struct SeqLayout {
  int w = 1;
  int64_t T = 0;
  bool balanced = false;  // chunks r and 2w - 1 - r of 2w; otherwise the r-th w-th
  int64_t local() const { return T / w; }
  // Rank r's positions, in the order its activations hold them.
  std::vector<int64_t> positions(int r) const;
  // (query, key) pairs rank r's queries see: causal counts key <= query.
  int64_t visiblePairs(int r, bool causal) const;
};

class SequenceAttention {
 public:
  // `ringRank`: this rank's place on the axis; `fault`: kNone but in the planted-fault tests.
  SequenceAttention(Variant variant, Fault fault, const SeqLayout& layout, bool causal,
                    double scale, int ringRank);

  // This rank's positions, in the order its activations hold them (long).
  const at::Tensor& positions() const { return pos_; }
  // Every rank's positions in rank order, and the permutation that puts them in order: row i
  // of a tensor gathered in rank order is position allPositions()[i]; index_select(inverse())
  // sorts it.
  const at::Tensor& allPositions() const { return allPos_; }
  const at::Tensor& inverse() const { return inverse_; }
  // ring/p2p: per source rank, whether this rank's queries see any of its keys; ring/allgather:
  // per block of T / w keys in position order; empty for ulysses.
  const std::vector<bool>& visible() const {
    return variant_ == Variant::kRingP2P ? ringVisible_ : blockVisible_;
  }

  // Attention of this rank's queries [B, H, T / w, dh] over every rank's keys and values
  // (same shape), through `axis`: [B, H, T / w, dh]. Differentiable where grad mode is on (the
  // ring variants as one autograd node, RingAttention; Ulysses through autograd collectives).
  at::Tensor attend(harness::Communicator& axis, const at::Tensor& q, const at::Tensor& k,
                    const at::Tensor& v) const;

  // The ring variants' halves, for RingAttention. `keptKv`: all-gather's gathered keys and
  // values, kept for the backward (undefined for ring/p2p).
  kernels::AttentionResult ringForward(harness::Communicator& axis, const at::Tensor& q,
                                       const at::Tensor& k, const at::Tensor& v,
                                       at::Tensor* keptKv) const;
  std::vector<at::Tensor> ringBackward(harness::Communicator& axis, const at::Tensor& q,
                                       const at::Tensor& k, const at::Tensor& v,
                                       const at::Tensor& keptKv, const at::Tensor& out,
                                       const at::Tensor& lse, const at::Tensor& dout) const;

 private:
  at::Tensor ulysses(harness::Communicator& axis, const at::Tensor& q, const at::Tensor& k,
                     const at::Tensor& v) const;

  Variant variant_;
  Fault fault_;
  SeqLayout layout_;
  bool causal_;
  double scale_;
  at::Tensor pos_, allPos_, inverse_;
  // ring/p2p: per source rank, the mask of this rank's queries against its keys (undefined:
  // none) and whether any key is visible. ring/allgather: the same per block of T / w keys in
  // position order. ulysses: the whole sequence's causal mask.
  std::vector<at::Tensor> ringMask_, blockMask_;
  std::vector<bool> ringVisible_, blockVisible_;
  at::Tensor wholeMask_;
};

}  // namespace sb::strategies::cp
