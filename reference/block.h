#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "reference/workload.h"

namespace sb::reference {

// One pre-LN transformer block with hidden dropout (workload "transformer_block"), the unit
// Megatron-LM's tensor and sequence parallelism shard:
//   r   = x + dropout0(attention(ln1(x)) Wo^T + bo)
//   out = r + dropout1(gelu(ln2(r) W1^T + b1) W2^T + b2)
// attention is multi-head self-attention over the sequence (causal by default). The fused QKV
// weight is in Megatron's per-head layout: rows (head, {q, k, v}, d_head), so that a rank's
// heads are one block of rows. Dropout keeps an element when a hash of (seed + site, its index
// in the full [batch, seq, d_model] tensor) passes (reference::dropoutKeepMask): every sharding
// draws the unsharded run's masks. Training: the backward starts from grad_output.
struct BlockShape {
  int64_t batch = 2, seq = 16, dModel = 32, heads = 4;
  double dropout = 0.1;
  bool causal = true;
  // Throws naming the key; keys batch, seq, d_model, heads, dropout, causal.
  static BlockShape parse(const nlohmann::json& shape);
  int64_t dHead() const { return dModel / heads; }
  std::vector<int64_t> activation() const { return {batch, seq, dModel}; }
  std::string toString() const;
};

// The block's parameters, by name, with their shapes, in order.
std::vector<std::pair<std::string, std::vector<int64_t>>> blockParameters(const BlockShape& s);

// The block on whatever pieces `p` holds (by parameter name: the whole parameters for the
// reference) with no communication: the plain reference. `taps`, where given, receives the
// activations between its parts, named by blockTapNames(), in that order.
at::Tensor blockForward(const BlockShape& s, const std::map<std::string, at::Tensor>& p,
                        const at::Tensor& x, uint64_t seed,
                        std::vector<std::pair<std::string, at::Tensor>>* taps = nullptr);
// The [batch, seq, d_model] activations between the block's parts: ln_1, attn.proj (the
// attention's output, its bias added), attn.residual, ln_2, mlp.proj, block.out.
const std::vector<std::string>& blockTapNames();

// Attention of `heads` heads over [batch, seq, heads * 3 * d_head] fused projections (the
// per-head layout above), causal or not: [batch, seq, heads * d_head].
at::Tensor blockAttention(const at::Tensor& qkv, int64_t heads, int64_t dHead, bool causal);

const Workload* blockWorkload();

}  // namespace sb::reference
