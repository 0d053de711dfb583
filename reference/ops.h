#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "reference/workload.h"

namespace sb::reference {

// One operator of a model, alone (workload "op"): the unit that an auto-parallel system gives a
// set of sharding strategies (ColossalAI's node handlers, DTensor's per-op rules).
//
// A case's shape names the operator and its operands:
//   {"op": "bmm", "input": [4, 8, 16], "other": [4, 16, 8]}
// Operators and their keys (tensor shapes are lists of dimensions):
//   addmm        input [M, K], other [K, N]; bias [N], or [M, N] with "bias": [M, N]
//                                                                out = bias + input @ other
//   bmm          input [b, i, k], other [b, k, j]
//   matmul       input [k] or [m, k], other [k]                  dot and matrix-vector forms;
//                input [b, h, m, k], other [b, h, k, n]          batched over two dimensions
//                (attention's scores and context, batch and heads apart)
//   embedding    input (ids, any shape), num_embeddings, embedding_dim; weight [V, E]
//   layer_norm   input [..., H]; weight, bias [H]                 over the last dimension
//   batch_norm   input [N, C, ...]; weight, bias [C]              training statistics
//   conv2d       input [N, C, H, W], out_channels, kernel, stride (1), padding (0); bias
//   max_pool2d, avg_pool2d   input [N, C, H, W], kernel, stride (= kernel)
//   add, mul     input, other (broadcasting)
//   gelu, relu   input
//   dropout      input, p: the mask is a function of each element's global index and the seed
//   softmax      input, dim; scale (1), causal (false): softmax(scale * input), with a causal
//                mask over the last two dimensions (attention's scores) when causal
//   view         input, size (one -1 allowed)
//   reshape      input, size (one -1 allowed): as view, but a strategy of its own (ColossalAI's
//                DefaultReshapeGenerator gathers the input whatever its layout)
//   getitem      input, index: an integer (input[index], the first dimension dropped) or
//                [start, stop] (input[start:stop]), on the first dimension
//   permute      input, dims;   transpose: input, dim0, dim1
//   contiguous   input: a contiguous copy of a permuted input (the input itself otherwise), as
//                Tensor::contiguous
//   split        input, split_size, dim: outputs output0, output1, ...
//   sum          input, dims
//   silu         input
//   aten         an imported model's operator that no strategy set knows, as data: schema,
//                operands, dtypes, args, outputs (reference/torchscript/aten_op.h); run whole
//                by LibTorch's own kernel, its operands "input", "other", "arg2", "arg3", ...
// The loss is sum(output * grad_output) per output: the reference backward starts from a
// deterministic grad_output, as the Linear reference does.
struct OpShape {
  std::string op;
  std::vector<int64_t> input, other;        // `other` empty for one-tensor operators
  std::vector<int64_t> weight, bias;        // parameters, derived from the keys; empty when none
  std::vector<std::vector<int64_t>> extra;  // "aten": its operands after the second
  nlohmann::json attrs = nlohmann::json::object();  // every other key, validated

  // Throws naming the key and what was expected on a malformed shape.
  static OpShape parse(const nlohmann::json& shape);

  // The tensor operands in order: "input", then "other", "weight", "bias" where present
  // ("aten": "input", "other", "arg2", ... for as many as it has).
  std::vector<std::string> operands() const;
  const std::vector<int64_t>& operandShape(const std::string& name) const;
  // Whether the reference computes a gradient for the operand (not for embedding ids).
  bool differentiable(const std::string& name) const;
  // The outputs' shapes; one but for split.
  std::vector<std::vector<int64_t>> outputs() const;
  // "output", or "output0", "output1", ... for split; the gradient seeds are "grad_" + that.
  std::vector<std::string> outputNames() const;

  int64_t attrInt(const std::string& key) const;
  // conv2d's and the poolings' window: the kernel, the stride (conv2d: 1, pooling: the
  // kernel, when the shape does not give one) and the padding (0 when not given).
  int64_t kernel() const { return attrInt("kernel"); }
  int64_t stride() const;
  int64_t padding() const;
  double attrDouble(const std::string& key) const;
  double scale() const;        // softmax's scale, 1 when not given
  bool causal() const;         // softmax's causal mask, false when not given
  int64_t queryGroup() const;  // softmax's rows per position (query_group), 1 when not given
  double theta() const;        // rope's base, 10000 when not given
  std::vector<int64_t> attrDims(const std::string& key) const;
  // The dimensions that `op` reduces or normalises over (softmax's dim, sum's dims, ...),
  // made non-negative; empty for operators without one.
  std::vector<int64_t> reducedDims() const;
  // permute, transpose: output dimension d is input dimension permutation()[d].
  std::vector<int64_t> permutation() const;
  // getitem: the rows [start, stop) of the input's first dimension it takes.
  std::pair<int64_t, int64_t> rows() const;
  std::string toString() const;
};

// The operators OpShape::parse accepts.
const std::vector<std::string>& opNames();

// The dropout keep-mask of the elements of `box` (offset, length per dimension) of a tensor of
// `fullShape`, as 0/1 values of `dtype`: element e is kept when a hash of (seed, its row-major
// index in the full tensor) is at least p. Every rank draws the mask of its own shard and the
// union is the mask of the unsharded run, whatever the sharding (DTensor's offset-based RNG
// does the same with Philox offsets).
at::Tensor dropoutKeepMask(const std::vector<int64_t>& fullShape,
                           const std::vector<int64_t>& offset, const std::vector<int64_t>& length,
                           uint64_t seed, double p, at::ScalarType dtype);

// softmax(scale * x) over `dim`; with `causal`, the entries above the diagonal of the last two
// dimensions masked first, x's rows being rows rowOffset, rowOffset + 1, ... of the whole
// tensor (a rank's box of attention scores) and its columns all of them. `queryGroup` rows
// share a position (grouped-query attention with the group's query heads stacked by row: row r
// is position r / queryGroup).
at::Tensor attentionSoftmax(const at::Tensor& x, int64_t dim, double scale, bool causal,
                            int64_t rowOffset, int64_t queryGroup = 1);

// RMSNorm over the last dimension (LLaMA's): x * rsqrt(mean(x^2) + eps) * weight, eps 1e-5.
at::Tensor rmsNorm(const at::Tensor& x, const at::Tensor& weight);

// Rotary position embedding (LLaMA's, rotate-half form) of x [batch, seq, heads, head_dim]
// whose sequence positions start at `positionOffset` (a rank's box of the sequence): each
// head's first and second halves rotated by pos * theta^(-2i / head_dim).
at::Tensor rotary(const at::Tensor& x, int64_t positionOffset, double theta);

// The operator on full tensors (`t` holds input, other, weight, bias by name), as plain
// LibTorch computes it. `seed` seeds dropout.
std::vector<at::Tensor> opForward(const OpShape& s, const std::map<std::string, at::Tensor>& t,
                                  uint64_t seed);

const Workload* opWorkload();

}  // namespace sb::reference
