#pragma once

// Models as graphs of the operators that have sharding strategies (reference/ops.h): what an
// auto-sharding solver chooses a strategy for, node by node.
//
// A graph is built in C++ from a workload's shape, not traced. Each node is one operator at its
// full size (an OpShape), reading named values: the model's inputs (token ids, positions: data,
// never differentiated), its parameters (leaves, whose gradients are checked) and the outputs
// of earlier nodes ("h0.attn.q", or "h0.attn.split:1" for the second output of a split).
// Nodes are in topological order. The nodes of the repeated blocks carry their layer and their
// role inside the block ("attn.q"): nodes of one role are the same computation on the same
// shapes, which a solver may give one shared strategy.
//
// Workloads (each also a reference workload written in plain LibTorch, which running the
// graph unsharded must equal):
//   gpt2  token and position embeddings; `layers` pre-LN decoder blocks: layer norm, query, key and
//         value projections (addmm each; Megatron's column-parallel split needs them apart or
//         a per-head fused layout), per-head views, causal attention as bmm, scaled masked
//         softmax, dropout on the probabilities and bmm, output projection, residual add,
//         layer norm, MLP (addmm, GELU, addmm), residual add; a final layer norm and the LM
//         head tied to the token embedding (its transpose, with a bias).
//   bert  the same embeddings and a layer norm, then `layers` post-LN encoder blocks
//         (bidirectional attention; x = LN(x + attn(x)); x = LN(x + mlp(x))); the output is the
//         last hidden states.
//   mlp   `layers` residual MLP blocks (addmm, GELU, addmm, add) on features [batch, d_model].
// Shapes: {"batch": 2, "seq": 16, "d_model": 32, "heads": 4, "layers": 2, "vocab": 64,
// "dropout": 0.1} (mlp: batch, d_model, layers). Tokens are flattened: activations are
// [batch * seq, d_model], viewed as [batch, seq, heads, d_head] for attention.
//
// Dropout: the attention dropout of block l draws reference::dropoutKeepMask with seed + 1 + l
// (GraphNode::seedOffset), in the graph and in the plain reference alike.

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "reference/ops.h"
#include "reference/workload.h"

namespace sb::reference {

struct GraphNode {
  std::string name;  // unique, e.g. "h0.attn.q"
  OpShape shape;     // the operator at full size
  // The value each operand reads, in OpShape::operands() order.
  std::vector<std::string> args;
  int layer = -1;           // the repeated block, -1 outside the blocks
  std::string role;         // the node's name inside its block ("attn.q"); its name outside one
  uint64_t seedOffset = 0;  // dropout: its mask's seed is the case's seed + this

  // The names of this node's output values: its name, or name:0, name:1, ... for a split.
  std::vector<std::string> outputs() const;
};

struct GraphShape {
  int64_t batch = 2, seq = 16, dModel = 32, heads = 4, layers = 2, vocab = 64;
  int64_t kvHeads = 4, ffn = 128;  // llama: key and value heads (grouped-query), the MLP's width
  double dropout = 0.1;
  // Throws InputError-style messages naming the key (std::invalid_argument).
  static GraphShape parse(const std::string& workload, const nlohmann::json& shape);
  int64_t tokens() const { return batch * seq; }
  int64_t dHead() const { return dModel / heads; }
};

struct Graph {
  std::string workload;  // gpt2, bert, mlp
  GraphShape shape;
  std::vector<GraphNode> nodes;  // topological order
  // The model's inputs (data) and parameters, with their full shapes, in order.
  std::vector<std::pair<std::string, std::vector<int64_t>>> inputs, parameters;
  std::string output;  // the value the model returns
  // torchscript: the case's shape the graph was imported from (reference/torchscript).
  nlohmann::json importShape;
  // Lookups by name, filled by buildGraph (index()): node by name, and which names are
  // parameters and inputs.
  std::map<std::string, int> nodeIndex;
  std::map<std::string, bool> isParameterName;
  std::map<std::string, bool> gradOf;  // requiresGrad, per node output
  void index();

  // The node index producing `value`, with the output's index; {-1, 0} for inputs and
  // parameters.
  std::pair<int, int> producer(const std::string& value) const;
  bool isParameter(const std::string& value) const;
  bool isInput(const std::string& value) const;
  // Whether autograd computes a gradient for `value`: a parameter, or a node's output that
  // reads one through a differentiable operand; not the inputs, nor values computed from
  // inputs alone (an imported model's rotary tables sliced from a buffer).
  bool requiresGrad(const std::string& value) const;
  // The full shape of any value.
  std::vector<int64_t> valueShape(const std::string& value) const;
  nlohmann::json toJson() const;
};

// Throws std::invalid_argument naming the key for a malformed shape or an unknown workload.
// "torchscript" imports the model its shape names (reference/torchscript/import.h).
Graph buildGraph(const std::string& workload, const nlohmann::json& shape);
// The workloads buildGraph knows.
const std::vector<std::string>& graphWorkloads();

// One node through reference::opForward: its arguments by name from `arg`, its outputs in the
// order of node.outputs(). The seed is the run's; the node adds its own offset.
std::vector<at::Tensor> runNode(const GraphNode& node,
                                const std::function<at::Tensor(const std::string&)>& arg,
                                uint64_t seed);

// Runs the graph on whole tensors, node by node with reference::opForward: `values` holds the
// inputs and parameters by name; returns every value, those given included.
std::map<std::string, at::Tensor> runGraph(const Graph& g, std::map<std::string, at::Tensor> values,
                                           uint64_t seed);

// The inputs and parameters of a graph workload, deterministic in `seed` (ids spread over the
// vocabulary, positions 0..seq-1 per sequence, parameters as nn initialises them).
std::map<std::string, at::Tensor> graphInputs(const Graph& g, at::ScalarType dtype, uint64_t seed,
                                              InputMode mode);

// The reference workloads gpt2, bert and mlp: the model in plain LibTorch (not the graph),
// forward from graphInputs and backward from grad_output; checks output and every
// grad/<parameter>.
const Workload* findGraphWorkload(const std::string& name);

}  // namespace sb::reference
