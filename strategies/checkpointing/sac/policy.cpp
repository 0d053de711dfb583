// Resolving a selective-checkpointing policy over a graph (policy.h).

#include "strategies/checkpointing/sac/policy.h"

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>

#include "harness/id_pattern.h"

namespace sb::strategies::sac {
namespace {

using reference::Graph;

bool isLinear(const std::string& op) { return op == "addmm" || op == "mm"; }
bool isCheap(const std::string& op) {
  static const std::set<std::string> k = {"add",  "mul",        "gelu",     "silu",   "dropout",
                                          "rope", "layer_norm", "rms_norm", "softmax", "relu"};
  return k.count(op) > 0;
}

// The decision of a node by a built-in's rule (views are settled after).
bool builtinSaves(const std::string& name, const reference::GraphNode& n, int linearIndex) {
  if (name == "save-all") return true;
  if (name == "recompute-all") return false;
  if (name == "cheap") return !isCheap(n.shape.op);
  // torchtitan: the products of linear layers but every second one (its count starts at 1 and
  // recomputes the even ones), and attention.
  if (isLinear(n.shape.op)) return linearIndex % 2 == 1;
  return n.role.rfind("attn.", 0) == 0 &&
         (n.role == "attn.scores" || n.role == "attn.softmax" || n.role == "attn.dropout" ||
          n.role == "attn.context");
}

bool decision(const nlohmann::json& v, const std::string& where) {
  if (v.is_string() && v.get<std::string>() == "save") return true;
  if (v.is_string() && v.get<std::string>() == "recompute") return false;
  throw std::invalid_argument(where + ": expected \"save\" or \"recompute\", got " + v.dump());
}

}  // namespace

bool isViewOp(const std::string& op) {
  return op == "view" || op == "reshape" || op == "permute" || op == "transpose" ||
         op == "split" || op == "contiguous";
}

const std::vector<std::string>& builtinPolicies() {
  static const std::vector<std::string> k = {"save-all", "recompute-all", "torchtitan", "cheap"};
  return k;
}

int storageOwner(const Graph& g, const std::string& value,
                 const std::set<std::pair<int, size_t>>* copies) {
  int v = g.producer(value).first;
  while (v >= 0 && isViewOp(g.nodes[static_cast<size_t>(v)].shape.op) &&
         !(copies && copies->count({v, 0}))) {
    v = g.producer(g.nodes[static_cast<size_t>(v)].args[0]).first;
  }
  return v;
}

Policy resolvePolicy(const Graph& g, const nlohmann::json& spec) {
  Policy p;
  const size_t n = g.nodes.size();
  p.save.assign(n, true);
  p.region.assign(n, -1);
  for (size_t v = 0; v < n; ++v) p.region[v] = g.nodes[v].layer;
  std::vector<bool> rule(n, true);
  checkPolicySpec(spec);
  if (spec.is_string()) {
    p.name = spec.get<std::string>();
    std::map<int, int> linears;  // per block, its linear products so far
    for (size_t v = 0; v < n; ++v) {
      const auto& node = g.nodes[v];
      const int k = isLinear(node.shape.op) ? ++linears[node.layer] : 0;
      rule[v] = builtinSaves(p.name, node, k);
    }
  } else if (spec.is_object()) {
    p.name = "custom";
    const bool byDefault = spec.contains("default") ? decision(spec["default"], "policy.default")
                                                    : true;
    std::set<std::string> opsInGraph;
    for (const auto& node : g.nodes) opsInGraph.insert(node.shape.op);
    std::map<std::string, bool> ops;
    if (spec.contains("ops")) {
      for (const auto& [op, value] : spec["ops"].items()) {
        if (!opsInGraph.count(op)) {
          std::string have;
          for (const auto& o : opsInGraph) have += (have.empty() ? "" : ", ") + o;
          throw std::invalid_argument("policy.ops: \"" + op + "\" is no operator of " +
                                      g.workload + "'s graph; it has " + have);
        }
        ops[op] = decision(value, "policy.ops." + op);
      }
    }
    std::vector<std::pair<std::string, bool>> patterns;
    std::vector<harness::IdPattern> compiled;
    if (spec.contains("nodes")) {
      for (const auto& [pattern, value] : spec["nodes"].items()) {
        const bool d = decision(value, "policy.nodes." + pattern);
        try {
          compiled.emplace_back(pattern);
        } catch (const std::invalid_argument& e) {
          throw std::invalid_argument("policy.nodes: " + std::string(e.what()));
        }
        patterns.emplace_back(pattern, d);
      }
    }
    std::vector<bool> patternUsed(patterns.size(), false);
    for (size_t v = 0; v < n; ++v) {
      const auto& node = g.nodes[v];
      bool d = byDefault;
      if (auto it = ops.find(node.shape.op); it != ops.end()) d = it->second;
      int matched = -1;
      for (size_t i = 0; i < patterns.size(); ++i) {
        if (!compiled[i].fullMatch(node.name)) continue;
        patternUsed[i] = true;
        if (matched >= 0 && patterns[static_cast<size_t>(matched)].second != patterns[i].second) {
          throw std::invalid_argument("policy.nodes: \"" + patterns[static_cast<size_t>(matched)].first +
                                      "\" and \"" + patterns[i].first + "\" both match " +
                                      node.name + " with different decisions");
        }
        matched = static_cast<int>(i);
        d = patterns[i].second;
      }
      rule[v] = d;
    }
    for (size_t i = 0; i < patterns.size(); ++i) {
      if (!patternUsed[i]) {
        throw std::invalid_argument("policy.nodes: \"" + patterns[i].first +
                                    "\" matches no node of " + g.workload +
                                    "'s graph (names like " +
                                    (n > 0 ? g.nodes[n / 2].name : std::string("?")) + ")");
      }
    }
  }
  return makePolicy(g, p.name, rule);
}

void checkPolicySpec(const nlohmann::json& spec) {
  if (spec.is_string()) {
    const auto& builtins = builtinPolicies();
    if (std::find(builtins.begin(), builtins.end(), spec.get<std::string>()) != builtins.end()) {
      return;
    }
    std::string names;
    for (const auto& b : builtins) names += (names.empty() ? "" : ", ") + b;
    throw std::invalid_argument("policy: unknown policy " + spec.dump() + "; expected one of " +
                                names + ", or an object {default, ops, nodes}");
  }
  if (!spec.is_object()) {
    throw std::invalid_argument("policy: expected a policy's name or an object, got " +
                                spec.dump());
  }
  for (const auto& [key, value] : spec.items()) {
    if (key != "default" && key != "ops" && key != "nodes") {
      throw std::invalid_argument("policy: unknown key \"" + key +
                                  "\"; expected default, ops, nodes");
    }
    if (key == "default") {
      decision(value, "policy.default");
      continue;
    }
    if (!value.is_object()) {
      throw std::invalid_argument("policy." + key +
                                  ": expected an object of \"save\" or \"recompute\", got " +
                                  value.dump());
    }
    for (const auto& [name, d] : value.items()) decision(d, "policy." + key + "." + name);
  }
}

Policy makePolicy(const Graph& g, std::string name, const std::vector<bool>& rule) {
  Policy p;
  const size_t n = g.nodes.size();
  p.name = std::move(name);
  p.save.assign(n, true);
  p.region.assign(n, -1);
  for (size_t v = 0; v < n; ++v) p.region[v] = g.nodes[v].layer;
  // Outside the blocks everything is kept; a view takes its storage's decision.
  for (size_t v = 0; v < n; ++v) {
    if (p.region[v] < 0) continue;
    if (isViewOp(g.nodes[v].shape.op)) {
      const int owner = storageOwner(g, g.nodes[v].outputs()[0]);
      p.save[v] = owner < 0 || p.region[static_cast<size_t>(owner)] != p.region[v] ||
                  p.save[static_cast<size_t>(owner)];
    } else {
      p.save[v] = rule[v];
    }
  }
  return p;
}

}  // namespace sb::strategies::sac
