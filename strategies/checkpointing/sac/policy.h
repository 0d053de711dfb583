#pragma once

// Selective activation checkpointing's policies: per operator of a graph workload
// (reference/graph.h), whether the tensors its autograd node saves are kept from the forward to
// the backward, or dropped and recomputed there (sac_runtime.h runs them, sac_strategy.cpp makes
// them executors).
//
// A policy applies inside the repeated blocks (a node's `layer`), each block one region as
// torchtitan wraps each TransformerBlock in its own checkpoint: what crosses a block's boundary
// and everything outside the blocks (embeddings, the final norm, the head) is kept. A view
// (view, reshape, permute, transpose, split, contiguous) allocates nothing of its own: it takes
// the decision of the node whose storage it views, so "keep the attention's output" keeps the
// views of it too.
//
// Built-in (policyByName):
//   save-all       keep everything: the plain step, through the same hooks.
//   recompute-all  keep only what crosses the block's boundary: full checkpointing per block.
//   torchtitan     torchtitan's per-op policy: keep the products of the linear layers (its
//                  aten.mm; here addmm and mm) but every second one in a block's forward order,
//                  and attention (its SDPA; here the decomposed attention from scores to
//                  context), recompute the rest (norms, activations, residual adds, rope).
//   cheap          recompute the element-wise operators and the norms (add, mul, gelu, silu,
//                  dropout, rope, layer_norm, rms_norm, softmax), keep the products and the
//                  rest.
// A policy of one's own (params.policy, an object):
//   {"default": "save" | "recompute",
//    "ops":   {"<op>": "save" | "recompute", ...},        an operator kind (graph.h's ops)
//    "nodes": {"<pattern>": "save" | "recompute", ...}}  a node or module path, a regular
//                                                        expression over the whole node name
//                                                        ("h[0-9]+\\.mlp\\..*")
// The most specific wins: a node pattern over an op over the default; two patterns that match
// one node with different decisions are refused.

#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "reference/graph.h"

namespace sb::strategies::sac {

// Views: they take the decision of what they view.
bool isViewOp(const std::string& op);

struct Policy {
  std::string name;        // the built-in's, or "custom"
  std::vector<bool> save;  // per node of the graph, after the rules above
  // Per node: the region it belongs to (its block), -1 outside every block.
  std::vector<int> region;
};

// The built-ins' names, in the order above.
const std::vector<std::string>& builtinPolicies();

// params.policy's form, before any graph: a built-in's name, or an object {default, ops,
// nodes} of "save" / "recompute" decisions. Throws std::invalid_argument naming the key.
void checkPolicySpec(const nlohmann::json& spec);
// `spec`: a built-in's name or a policy object (above). Throws std::invalid_argument naming the
// key or value and what was expected.
Policy resolvePolicy(const reference::Graph& g, const nlohmann::json& spec);

// A policy from one decision per node (`rule`, true: keep): the rules above applied (outside the
// blocks kept, views taking their storage's decision).
Policy makePolicy(const reference::Graph& g, std::string name, const std::vector<bool>& rule);

// The node whose storage a value lives in: through views to the first node that allocates; -1
// for the data and the parameters. `copies` (a sharded plan's (node, operand) reads whose
// redistribution copies): a view reading its input through one owns that copy.
int storageOwner(const reference::Graph& g, const std::string& value,
                 const std::set<std::pair<int, size_t>>* copies = nullptr);

}  // namespace sb::strategies::sac
