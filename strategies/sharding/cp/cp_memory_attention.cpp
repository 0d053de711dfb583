// The memory model's replay of the attention (cp_memory_replay.h): the online softmax's blocks,
// the ring's forward and backward (ring/p2p, ring/allgather) and Ulysses' all-to-alls, as
// sequence_attention.cpp and kernels/attention.cpp allocate them.

#include "strategies/sharding/cp/cp_memory_replay.h"

namespace sb::strategies::cp::replay {

// kernels::OnlineSoftmaxBlocks::add on one key block.
void Replay::blockForward() {
  product(fold, A, S, "scores");
  a(R, "amax");
  a(R, "new max");
  f(R, "amax");
  shift();
  a(S, "p");
  a(R, "rescale");
  transient(R, "p row sum");
  transient(A, "p v");
  f(R, "old max");
  f(R, "rescale");
  f(S, "p");
  f(R, "shift");
  f(S, "scores");
}

// kernels::OnlineSoftmaxBackwardBlocks::add on one key block: dk and dv stay allocated.
void Replay::blockBackward() {
  product(fold, A, S, "scores");
  product(fold, A, A, "dv");  // p^T dO, dO copied
  product(fold, A, S, "ds");  // dO v^T
  transient(A, "ds k");
  product(fold, A, A, "dk");  // ds^T scaledQ
  f(S, "ds");
  f(S, "scores");
}

void Replay::ringForward() {
  const int64_t w = s_.w;
  scaled(A, "scaled q");
  a(R, "max");
  a(R, "sum");
  a(A, "acc");
  if (s_.variant == Variant::kRingP2P) {
    a(2 * A, "kv stacked");
    for (int64_t step = 0; step < w; ++step) {
      const int64_t src = ((s_.ringRank - step) % w + w) % w;
      if (step > 0) {
        a(2 * A, "kv received");
        f(2 * A, "kv sent");
      }
      if (s_.visible.at(src)) blockForward();
    }
  } else {
    a(2 * A, "kv stacked");
    a(2 * A, "kv rows");
    f(2 * A, "kv stacked");
    const int64_t scratch = s_.cpScratch(Collective::kAllGather, 2 * A, 2 * A);
    a(scratch, "all-gather scratch");
    a(2 * A * w, "kv gathered");
    f(scratch, "all-gather scratch");
    a(2 * A * w, "kv in position order");
    f(2 * A * w, "kv gathered");
    for (bool v : s_.visible) {
      if (v) blockForward();
    }
  }
  // finish(): acc / (l == 0 ? 1 : l), lse = m + log l.
  a(R, "ones_like");
  a(8, "scalar");
  a(es, "scalar cast");
  a(Rb, "eq");
  f(8, "scalar");
  f(es, "scalar cast");
  transient(R, "where");
  f(Rb, "eq");
  f(R, "ones_like");
  a(R, "log");
  a(R, "lse");
  f(R, "log");
  f(2 * A, "kv");  // p2p: the last block received; all-gather: this rank's rows
  f(R, "sum");
  f(R, "max");
  f(A, "scaled q");
  if (!s_.training) {
    f(R, "lse");
    if (s_.variant == Variant::kRingAllGather) f(2 * A * w, "kv in position order");
  }
}

void Replay::ringBackward() {
  const int64_t w = s_.w;
  scaled(A, "scaled q");
  a(A, "dO out");
  a(R, "delta");
  f(A, "dO out");
  shift();
  a(A, "dq");
  if (s_.variant == Variant::kRingP2P) {
    a(2 * A, "own kv");
    for (int64_t step = 0; step < w; ++step) {
      const int64_t src = ((s_.ringRank - step) % w + w) % w;
      if (step > 0) {
        a(2 * A, "kv received");
        a(2 * A, "dkv received");
        if (step > 1) f(2 * A, "kv passed on");
        f(2 * A, "dkv passed on");
      }
      const bool visible = s_.visible.at(src);
      if (visible) {
        blockBackward();
        a(2 * A, "dk dv stacked");
        f(A, "dk");
        f(A, "dv");
      }
      if (step == 0 && !visible) a(2 * A, "dkv zeros");
      if (step > 0 && visible) f(2 * A, "dk dv stacked");
    }
    if (s_.fault != Fault::kDkvNotReturned) {
      a(2 * A, "dkv home");
      f(2 * A, "dkv sent");
    }
    if (w > 1) f(2 * A, "kv");
    f(2 * A, "own kv");
  } else {
    a(2 * A * w, "dkv all");
    for (bool v : s_.visible) {
      if (!v) continue;
      blockBackward();
      a(2 * A, "dk dv stacked");
      f(2 * A, "dk dv stacked");
      f(A, "dk");
      f(A, "dv");
    }
    a(2 * A * w, "dkv in rank order");
    const int64_t scratch = s_.cpScratch(Collective::kReduceScatter, 2 * A, 2 * A);
    a(scratch, "reduce-scatter scratch");
    a(2 * A, "dkv reduce-scattered");
    f(scratch, "reduce-scatter scratch");
    f(2 * A * w, "dkv in rank order");
    f(2 * A * w, "dkv all");
  }
  f(R, "shift");
  f(R, "delta");
  f(A, "scaled q");
}

void Replay::allToAll(int64_t bytes, const char* what) {
  const int64_t scratch = s_.cpScratch(Collective::kAllToAll, bytes, bytes);
  a(scratch, "all-to-all scratch");
  a(bytes, what);
  f(scratch, "all-to-all scratch");
}

// SequenceAttention::ulysses: q, k and v to head shards, attention over the whole sequence of
// this rank's Hl heads, the output back to sequence shards. Leaves the result allocated (a
// view of the second all-to-all's result, or its copy where B > 1 and Hl > 1).
void Replay::ulyssesForward() {
  const bool training = s_.training;
  a(3 * A, "qkv stacked");
  a(3 * A, "qkv by rank");
  f(3 * A, "qkv stacked");
  allToAll(3 * A, "qkv head shards");
  a(3 * A, "heads copy");
  a(3 * A, "heads");
  f(3 * A, "heads copy");
  f(3 * A, "qkv head shards");
  a(Sf, "scores");
  scaled(Sf, "scores scaled");
  f(Sf, "scores");
  if (s_.causal) {
    a(Sf, "scores masked");
    f(Sf, "scores scaled");
  }
  a(Sf, "probabilities");
  a(A, "o");
  if (!training) f(Sf, "probabilities");
  // o.transpose(1, 2).reshape(...): a copy, but where one head only moves a dimension of 1.
  if (s_.fault == Fault::kUlyssesSwapped && Hl > 1) {
    a(A, "o swapped");
    f(A, "o");
  }
  a(A, "o by position");
  const bool sendCopy = B * Hl > 1;
  if (sendCopy) {
    a(A, "o by rank");
    f(A, "o by position");
  }
  allToAll(A, "o sequence shards");
  if (B > 1 && Hl > 1) {
    a(A, "o merged");
    f(A, "o sequence shards");
  }
  f(A, "o by rank");
  f(A, "o");
  f(Sf, "scores");
  if (!training) f(3 * A, "heads");
  f(3 * A, "qkv by rank");
}

// Its backward, from the output projection's input gradient (consumed) to q, k and v's
// gradients, views of one [3, B, H, T / w, dh] buffer, left allocated.
void Replay::ulyssesBackward() {
  a(A, "dO contiguous");
  allToAll(A, "dO head shards");
  f(A, "dO contiguous");
  f(A, "proj grad consumed");
  if (B * Hl > 1) {
    a(A, "dO by position");
    f(A, "dO head shards");
  }
  a(A, "dO index_select backward");
  f(A, "dO consumed");
  if (s_.fault == Fault::kUlyssesSwapped && Hl > 1 && B > 1) {  // the swap undone: a copy
    a(A, "dO unswapped");
    f(A, "dO index_select backward");
  }
  a(A, "dv");
  a(Sf, "dp");
  f(A, "dO");
  a(Sf, "softmax grad");
  f(Sf, "dp");
  f(Sf, "probabilities saved");
  a(3 * A, "select backward v");
  f(A, "dv");
  if (s_.causal) {
    a(Sf, "masked_fill grad");
    f(Sf, "softmax grad");
  }
  scaled(Sf, "scores grad");
  f(Sf, "masked_fill grad");
  a(A, "dq");
  a(A, "dk");
  f(Sf, "scores grad");
  f(3 * A, "heads saved");
  for (const char* which : {"select backward k", "select backward q"}) {
    a(3 * A, which);
    f(A, "d head consumed");
    gradSum(3 * A, "dqkv sum", "dqkv", true, which);
  }
  a(3 * A, "index_select backward");
  f(3 * A, "dqkv sum");
  a(3 * A, "dqkv contiguous");
  allToAll(3 * A, "dqkv sequence shards");
  f(3 * A, "dqkv contiguous");
  f(3 * A, "dqkv consumed");
  if (Hl > 1) {
    a(3 * A, "dqkv merged");
    f(3 * A, "dqkv sequence shards");
  }
}

}  // namespace sb::strategies::cp::replay
