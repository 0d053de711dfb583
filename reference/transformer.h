#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "reference/workload.h"

namespace sb::reference {

// A GPT-2-style stack of pre-LN blocks without dropout, in the pieces a chunking strategy
// runs separately:
//   block(x) = r + ffn(ln2(r)),  r = x + attention(ln1(x))
// attention is causal multi-head self-attention over the sequence (dimension 1 of
// [batch, seq, d_model]); ffn is Linear(d, 4d), GELU, Linear(4d, d) on each token.
struct TransformerShape {
  int64_t batch = 1, seq = 256, dModel = 64, heads = 4, layers = 2;
  bool training = false;  // mode: inference (prefill) or training (forward and backward)
  bool causal = true;     // GPT-2: a token sees those before it; ViT: every patch sees all
  // Throws naming the key; keys batch, seq, d_model, heads, layers, mode (inference|training).
  // `workload` is gpt2_prefill (causal) or vit_encoder (not).
  static TransformerShape parse(const nlohmann::json& shape,
                                const std::string& workload = "gpt2_prefill");
  std::string toString() const;
};

class Transformer {
 public:
  Transformer(const TransformerShape& shape, at::ScalarType dtype, uint64_t seed);

  const TransformerShape& shape() const { return shape_; }
  int layers() const { return static_cast<int>(layers_.size()); }

  at::Tensor ln1(int l, const at::Tensor& x) const;
  at::Tensor ln2(int l, const at::Tensor& x) const;
  // Keys and values of every token, [batch, heads, seq, d_head] each, from ln1's output.
  std::pair<at::Tensor, at::Tensor> keysValues(int l, const at::Tensor& h) const;
  // Attention of the queries of rows [begin, end) of `h` (ln1's output for those rows) to the
  // keys and values of tokens [0, keyEnd), causally (query t sees keys <= t), projected out:
  // [batch, end - begin, d_model]. With begin = 0 and end = keyEnd = seq, the whole sequence.
  at::Tensor attention(int l, const at::Tensor& hRows, int64_t begin, const at::Tensor& k,
                       const at::Tensor& v, int64_t keyEnd) const;
  // attention()'s two ends, for a strategy that computes its middle another way: the queries
  // of `hRows` per head, [batch, heads, rows, d_model / heads], and the output projection of
  // the heads' results merged back to [batch, rows, d_model].
  at::Tensor queries(int l, const at::Tensor& hRows) const;
  at::Tensor project(int l, const at::Tensor& merged) const;
  // The keys the queries of rows up to `end` attend to: those before `end` when causal, all
  // otherwise.
  int64_t keyEnd(int64_t end) const { return shape_.causal ? end : shape_.seq; }
  at::Tensor ffn(int l, const at::Tensor& h) const;    // token-wise
  at::Tensor block(int l, const at::Tensor& x) const;  // unchunked
  at::Tensor forward(const at::Tensor& x) const;       // every block, unchunked

  const std::vector<std::pair<std::string, at::Tensor>>& parameters() const { return params_; }
  const at::Tensor& input() const { return input_; }
  const at::Tensor& target() const { return target_; }  // loss = sum(output * target)
  void zeroGrad() const;

 private:
  struct Layer {
    at::Tensor ln1w, ln1b, wqkv, bqkv, wo, bo, ln2w, ln2b, w1, b1, w2, b2;
  };
  at::Tensor param(const std::string& name, at::Tensor value);
  TransformerShape shape_;
  std::vector<Layer> layers_;
  std::vector<std::pair<std::string, at::Tensor>> params_;
  at::Tensor input_, target_;
};

// The `gpt2_prefill` (causal) and `vit_encoder` (bidirectional, over patch embeddings)
// workloads: inference builds "output"; training also "grad_input" and "grad/<parameter>" for
// every parameter, from loss = sum(output * target).
const Workload* gpt2PrefillWorkload();
const Workload* vitEncoderWorkload();

}  // namespace sb::reference
