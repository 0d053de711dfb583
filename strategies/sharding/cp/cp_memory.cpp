// The memory model of one context-parallel step (cp_memory.h).
//
// Written from the executor's code and the allocations LibTorch 1.13 makes for it on the CPU,
// read off SB_MEMORY_TRACE (reports/memory_trace.py --model lines the two up) and checked to the
// byte over float32 and float64; batches of 1 to 3; 1 to 8 heads; widths 16 to 64; sequences 16
// to 1024; rings of 1, 2 and 4 (every rank: causal rings skip different blocks); causal,
// load-balanced or not, and bidirectional; training and inference; CP x TP on 2x2; threads and
// gloo. In terms of a rank's sizes:
//   E   a token-wise activation of this rank, [B, T / w, d]
//   A   one of q, k, v or the attention output of this rank's heads, [B, T / w, d / tp]
//   U   the MLP's hidden units, [B, T / w, 4 d / tp]
//   S   one block of scores, [B, h, T / w, T / w] (h: this rank's heads)
//   Sf  Ulysses' whole scores of its head group, [B, h / w, T, T]
//   R   a row statistic of the online softmax, [B, h, T / w]
//   N   a layer norm's mean or inverse deviation, [B, T / w]
// Where a batched product's operand is a transposed view whose batch dimensions do not fold
// (q, and the output's gradient, when B > 1 and h > 1), matmul copies it first; a reshape of a
// transposed head view copies where h > 1. Autograd runs the executor's chain reversed (a
// parameter's slice made before the layer runs its backward after the layer's); a node frees
// the gradient it consumed, then what it saved, then its parameters' gradient temporaries
// (added in place into .grad, which lives across steps). A slice of a fused parameter gets a
// zero-padded whole-size gradient, and the slices' whole-size gradients meet in one buffer. The
// collectives' results are allocated as the Communicator does, their scratch as
// Communicator::scratchBytes says (before the result: gloo's per-rank buffers).

#include "strategies/sharding/cp/cp_memory.h"

#include "strategies/sharding/cp/cp_memory_replay.h"

namespace sb::strategies::cp {
namespace replay {

// ln2's backward (its input gradient consumed), then the residual's gradient: the block
// output's gradient (`seedFreeable`: a sum buffer, else the target) plus ln2's.
void Replay::ln2Backward(bool seedFreeable) {
  layerNormBackward();
  f(E, "ln2 grad consumed");
  f(E, "residual saved");
  f(N, "ln2 mean");
  f(N, "ln2 rstd");
  gradSum(E, "residual grad", "block grad", seedFreeable, "ln2 grad input");
  f(D * es, "ln2 weight grad");
  f(D * es, "ln2 bias grad");
}

// ln1's backward, then the block input's gradient: the residual's plus ln1's (a leaf's, the
// input's, at layer 0; the input is saved by ln1 beyond).
void Replay::ln1Backward(int64_t l) {
  layerNormBackward();
  f(E, "ln1 grad consumed");
  if (l > 0) f(E, "block input saved");
  f(N, "ln1 mean");
  f(N, "ln1 rstd");
  gradSum(E, "input grad", "residual grad", true, "ln1 grad input");
  f(D * es, "ln1 weight grad");
  f(D * es, "ln1 bias grad");
}

void Replay::layerForward(int64_t l) {
  const bool training = s_.training;
  layerNorm("ln1");
  a(2 * A, "kv projection");
  a(A, "q projection");
  const bool ulysses = s_.variant == Variant::kUlysses;
  if (ulysses) {
    ulyssesForward();
    if (headCopy) a(A, "heads merged");  // [B, H, T / w, dh] to [B, T / w, d / tp]
  } else {
    ringForward();  // its output is laid out as q: the heads merge in a view
  }
  a(E, "output projection");
  a(E, "residual");
  f(E, "output projection");
  layerNorm("ln2");
  a(U, "fc");
  a(U, "gelu");
  a(E, "mlp projection");
  if (!training) {
    f(U, "gelu");
    f(U, "fc");
  }
  a(E, "block output");
  if (!training && l > 0) f(E, "block input");
  f(E, "mlp projection");
  if (training && ulysses) {  // nothing saves q, k and v (stacked), nor the merged heads' source
    if (headCopy) f(A, "attention output");
    f(A, "q projection");
    f(2 * A, "kv projection");
  }
  if (!training) {
    f(E, "ln2");
    f(E, "residual");
    if (ulysses && headCopy) f(A, "heads merged");
    f(A, "attention output");
    f(A, "q projection");
    f(2 * A, "kv projection");
    f(E, "ln1");
  }
}

// The backward of layer l, whose output's gradient is `seedFreeable` (a sum buffer) or the
// target (the last layer's, held by the executor).
void Replay::layerBackward(int64_t l, bool seedFreeable) {
  const int64_t F = 4 * Da;
  // The MLP's second linear (its input, gelu's output, saved).
  linearBackward(U, F * D * es, D * es);
  f(U, "gelu saved");
  f(D * es, "mlp bias grad");
  f(F * D * es, "mlp weight grad");
  // gelu.
  a(U, "gelu grad");
  f(U, "fc grad consumed");
  f(U, "fc saved");
  // The MLP's first linear.
  linearBackward(E, F * D * es, F * es);
  f(U, "gelu grad consumed");
  f(E, "ln2 saved");
  f(F * es, "fc bias grad");
  f(F * D * es, "fc weight grad");
  // ln2, then the residual's gradient: the block's output gradient plus ln2's.
  ln2Backward(seedFreeable);
  // The output projection (its input, a view of the attention output, saved by attention).
  linearBackward(A, Da * D * es, D * es);
  if (s_.variant == Variant::kUlysses) f(A, "merged heads saved");
  f(D * es, "proj bias grad");
  f(Da * D * es, "proj weight grad");
  const bool ulysses = s_.variant == Variant::kUlysses;
  if (ulysses) {
    ulyssesBackward();
  } else {
    ringBackward();
    f(A, "proj grad consumed");
    f(A, "q saved");
    f(2 * A, "kv saved");
    f(A, "out saved");
    f(R, "lse saved");
    if (s_.variant == Variant::kRingAllGather) f(2 * A * s_.w, "kv kept");
  }
  // q's projection, a slice of the fused parameter: its whole-size gradients stay until k's
  // and v's arrive.
  // Ulysses' q, k and v gradients are views of one buffer, copied where the heads do not merge.
  if (ulysses && headCopy) a(A, "dq copy");
  linearBackward(E, Da * D * es, Da * es);
  if (!ulysses || headCopy) f(A, "dq");
  a(3 * D * D * es, "qkv weight grad (q)");
  f(Da * D * es, "q weight grad");
  a(3 * D * es, "qkv bias grad (q)");
  f(Da * es, "q bias grad");
  // k and v back to [B, T / w, d] (copies where the heads do not merge), then one buffer.
  const bool copies = headCopy && s_.variant != Variant::kRingAllGather;
  const int64_t buffer = ulysses ? 3 * A : 2 * A;
  if (copies) {
    a(A, "dv copy");
    a(A, "dk copy");
    f(buffer, "dkv");
  }
  a(2 * A, "dkv merged");
  if (copies) {
    f(A, "dv copy");
    f(A, "dk copy");
  } else {
    f(buffer, "dkv");
  }
  linearBackward(E, 2 * Da * D * es, 2 * Da * es);
  f(2 * A, "dkv merged consumed");
  f(E, "ln1 saved");
  a(E, "ln1 grad");
  f(E, "q path grad");
  f(E, "kv path grad");
  a(3 * D * D * es, "qkv weight grad (kv)");
  f(2 * Da * D * es, "kv weight grad");
  gradSum(3 * D * D * es, "qkv weight grad sum", "qkv weight grad (q)", true,
          "qkv weight grad (kv)");
  f(3 * D * D * es, "qkv weight grad sum");
  a(3 * D * es, "qkv bias grad (kv)");
  f(2 * Da * es, "kv bias grad");
  gradSum(3 * D * es, "qkv bias grad sum", "qkv bias grad (q)", true, "qkv bias grad (kv)");
  f(3 * D * es, "qkv bias grad sum");
  // ln1, then the block input's gradient.
  ln1Backward(l);
}

// A layer with this rank's heads and hidden units: q, k and v as three linears on slices of
// the fused parameter (v's made first: the arguments are evaluated right to left), the output
// projection and the MLP's second linear without bias (column slices), Megatron's g (an
// all-reduced copy) before each bias and f's all-reduce in the backward.
void Replay::tpLayerForward(int64_t l) {
  const bool ulysses = s_.variant == Variant::kUlysses;
  layerNorm("ln1");
  a(A, "v projection");
  a(A, "k projection");
  a(A, "q projection");
  if (ulysses) {
    ulyssesForward();
    f(A, "q projection");
    f(A, "k projection");
    f(A, "v projection");
    if (headCopy) a(A, "heads merged");
  } else {
    ringForward();
    if (!s_.training) {  // q, k and v were the call's temporaries
      f(A, "q projection");
      f(A, "k projection");
      f(A, "v projection");
    }
  }
  a(E, "output projection");
  tpAllReduce("output projection summed");
  a(E, "plus bias");
  a(E, "residual");
  f(E, "plus bias");
  f(E, "output projection summed");
  layerNorm("ln2");
  a(U, "fc");
  a(U, "gelu");
  if (!s_.training) f(U, "fc");
  a(E, "mlp projection");
  tpAllReduce("mlp projection summed");
  a(E, "plus bias");
  a(E, "block output");
  f(E, "plus bias");
  f(E, "mlp projection summed");
  f(E, "mlp projection");
  if (s_.training) {
    f(E, "output projection");
    if (ulysses && headCopy) f(A, "attention output");
    return;
  }
  f(U, "gelu");
  f(E, "ln2");
  f(E, "residual");
  f(E, "output projection");
  if (ulysses && headCopy) f(A, "heads merged");
  f(A, "attention output");
  f(E, "ln1");
  if (l > 0) f(E, "block input");
}

void Replay::tpLayerBackward(int64_t l, bool seedFreeable) {
  const bool ulysses = s_.variant == Variant::kUlysses;
  const int64_t F = 4 * Da;
  const bool summed = s_.fault != Fault::kTpInputGradUnsummed;
  transient(D * es, "mlp bias grad");
  a(D * F * es, "mlp weight grad");
  a(U, "gelu grad input");
  f(U, "gelu saved");
  sliceGrad(D * F * es, 4 * D * D * es);
  a(U, "gelu grad");
  f(U, "gelu grad input");
  f(U, "fc saved");
  linearBackward(E, F * D * es, F * es);
  f(U, "gelu grad consumed");
  f(E, "ln2 saved");
  sliceGrad(F * D * es, 4 * D * D * es);
  sliceGrad(F * es, 4 * D * es);
  tpAllReduce("ln2 grad summed");  // f
  f(E, "ln2 grad consumed");
  ln2Backward(seedFreeable);
  transient(D * es, "proj bias grad");
  a(D * Da * es, "proj weight grad");
  a(A, "proj grad input");
  if (ulysses) f(A, "merged heads saved");
  sliceGrad(D * Da * es, D * D * es);
  if (ulysses) {
    ulyssesBackward();
  } else {
    ringBackward();
    f(A, "proj grad consumed");
    f(A, "q saved");
    f(A, "k saved");
    f(A, "v saved");
    f(A, "out saved");
    f(R, "lse saved");
    if (s_.variant == Variant::kRingAllGather) f(2 * A * s_.w, "kv kept");
  }
  // q, k and v's linears; their parameters' slices are made before the layer, so their
  // gradients wait for the slices' backward after ln1's. k's and v's gradients are copied to
  // [B * T / w, d / tp] where the heads do not merge (ring/p2p, ulysses), or where the batch
  // and sequence do not (all-gather's reduce-scattered rows are sequence-major).
  const bool copies = s_.variant == Variant::kRingAllGather ? B > 1 : headCopy;
  const int64_t buffer = ulysses ? 3 * A : 2 * A;
  if (ulysses && headCopy) a(A, "dq copy");
  linearBackward(E, Da * D * es, Da * es);
  if (!ulysses || headCopy) f(A, "dq");
  if (copies) a(A, "dk copy");
  linearBackward(E, Da * D * es, Da * es);
  if (copies) f(A, "dk copy");
  // The q path's gradient waits in the buffer of Megatron's f (a custom function): 2.x adds
  // the k path's into a new tensor there, as the trace shows (which of LibTorch's conditions
  // refuses it is not traced yet; the layer without f adds in place).
  gradSum(E, "ln1 grad sum", "q path grad", true, "k path grad", /*firstReusable=*/false);
  if (copies) {
    a(A, "dv copy");
    f(buffer, "dqkv");
  }
  linearBackward(E, Da * D * es, Da * es);
  f(copies ? A : buffer, "dv consumed");
  f(E, "ln1 saved");
  gradSum(E, "ln1 grad sum (with v's)", "ln1 grad sum", true, "v path grad");
  if (summed) {
    tpAllReduce("ln1 grad summed");  // f
    f(E, "ln1 grad consumed");
  }
  ln1Backward(l);
  // The slices' backward: the bias's three, then the weight's, into one whole-size buffer.
  for (const auto& [slice, whole] :
       {std::pair<int64_t, int64_t>{Da * es, 3 * D * es}, {Da * D * es, 3 * D * D * es}}) {
    a(whole, "whole-size grad (first)");
    f(slice, "slice grad");
    for (int k = 0; k < 2; ++k) {
      a(whole, "whole-size grad");
      f(slice, "slice grad");
      gradSum(whole, "whole-size grad sum", "whole-size grad (before)", true, "whole-size grad");
    }
    f(whole, "whole-size grad sum");
  }
}

int64_t Replay::run() {
  const bool tp = s_.tp > 1;
  for (int64_t l = 0; l < s_.layers; ++l) {
    if (tp) {
      tpLayerForward(l);
    } else {
      layerForward(l);
    }
  }
  f(E, "last step's output");
  if (s_.training) f(E, "last step's input grad");
  if (!s_.training) return peak_;
  for (int64_t l = s_.layers - 1; l >= 0; --l) {
    if (tp) {
      tpLayerBackward(l, l < s_.layers - 1);
    } else {
      layerBackward(l, l < s_.layers - 1);
    }
  }
  // Every parameter's gradient all-reduced over the ring, in the model's order: with tensor
  // parallelism, a sharded one's slices (q, k and v's apart; a column slice copied to a
  // contiguous one first), a replicated one whole.
  const auto allReduce = [&](int64_t bytes, bool copied) {
    a(copied ? bytes : 0, "contiguous slice");
    transient(s_.cpScratch(Collective::kAllReduce, bytes, bytes), "all-reduce scratch");
    f(copied ? bytes : 0, "contiguous slice");
  };
  const int64_t F = 4 * Da;
  for (int64_t l = 0; l < s_.layers; ++l) {
    if (!tp) {
      for (int64_t n : {D, D, 3 * D * D, 3 * D, D * D, D, D, D, 4 * D * D, 4 * D, 4 * D * D, D}) {
        allReduce(n * es, false);
      }
      continue;
    }
    allReduce(D * es, false);
    allReduce(D * es, false);
    for (int k = 0; k < 3; ++k) allReduce(Da * D * es, false);
    for (int k = 0; k < 3; ++k) allReduce(Da * es, false);
    allReduce(D * Da * es, true);
    for (int k = 0; k < 3; ++k) allReduce(D * es, false);
    allReduce(F * D * es, false);
    allReduce(F * es, false);
    allReduce(D * F * es, true);
    allReduce(D * es, false);
  }
  return peak_;
}

}  // namespace replay

int64_t cpStepPeak(const CpStepSizes& s, std::vector<CpMemoryEvent>* log) {
  return replay::Replay(s, log).run();
}

}  // namespace sb::strategies::cp
