// The integer program of auto-sharding (model.h's ShardingModel::program): node classes,
// their costs, the edges' cost matrices and the memory rows, built as ilp.h's SelectionProblem,
// and the plan a selection means. Its own file: the inputs of the solver, apart from the
// prices (cost_model.cpp) and the algorithms that call it (algorithms.cpp).

#include "strategies/sharding/auto/model.h"

#include <algorithm>
#include <functional>
#include <numeric>

#include "strategies/sharding/auto/model_internal.h"

namespace sb::strategies::autoshard {
namespace {

using harness::Layout;
using reference::GraphNode;

}  // namespace

ShardingModel::Program ShardingModel::program(double memoryLimit) const {
  Program p;
  const int N = static_cast<int>(graph_.nodes.size());
  p.classOf.assign(N, -1);
  p.memberChoice.assign(N, {});
  std::map<std::string, int> classByKey;
  std::vector<int> classRoot;  // the node whose candidates are the class's choices
  for (int v = 0; v < N; ++v) {
    const GraphNode& n = graph_.nodes[v];
    const std::string key = n.layer < 0 ? "node:" + n.name : "role:" + n.role;
    if (auto it = classByKey.find(key); it != classByKey.end()) {
      // The same role in another block: the first block's mapping, on the same shapes. (A block
      // whose node has another candidate set, as one reading a parameter an earlier block owns
      // has no stored twins, is a class of its own.)
      int first = -1;
      for (int u = 0; u < v && first < 0; ++u) {
        if (graph_.nodes[u].layer >= 0 && graph_.nodes[u].role == n.role) first = u;
      }
      if (&candidates(v) == &candidates(first)) {
        p.classOf[v] = p.classOf[first];
        p.memberChoice[v] = p.memberChoice[first];
        continue;
      }
    }
    // A following node (one activation in, layouts following it) rides on its producer; not
    // on an imported operator kept whole, whose one layout it would be held to (a ReLU after
    // it splits by batch as well: data-parallel's plan needs it to).
    const std::string& op = n.shape.op;
    const bool follower = op == "gelu" || op == "relu" || op == "silu" || op == "dropout" ||
                          op == "view" || op == "permute" || op == "transpose" ||
                          op == "contiguous";
    if (follower && !graph_.isInput(n.args[0]) && !graph_.isParameter(n.args[0]) &&
        graph_.nodes[graph_.producer(n.args[0]).first].shape.op != "aten") {
      const auto [u, j] = graph_.producer(n.args[0]);
      const int c = p.classOf[u];
      std::vector<int> map;
      for (int k : p.memberChoice[u]) {
        const Layout& out = candidates(u)[k].outputs[j];
        int found = -1;
        for (size_t q = 0; q < candidates(v).size() && found < 0; ++q) {
          if (candidates(v)[q].op.operands[0] == out) found = static_cast<int>(q);
        }
        if (found < 0) break;
        map.push_back(found);
      }
      if (map.size() == p.memberChoice[u].size()) {
        p.classOf[v] = c;
        p.memberChoice[v] = map;
        classByKey[key] = c;
        continue;
      }
    }
    const int c = static_cast<int>(classRoot.size());
    classRoot.push_back(v);
    classByKey[key] = c;
    p.classOf[v] = c;
    p.memberChoice[v].resize(candidates(v).size());
    std::iota(p.memberChoice[v].begin(), p.memberChoice[v].end(), 0);
  }
  // Variables: each class's choices, costing its members' nodes.
  auto& prob = p.problem;
  prob.memoryLimit = memoryLimit;
  for (int root : classRoot) {
    SelectionProblem::Var var;
    var.name = graph_.nodes[root].layer < 0 ? graph_.nodes[root].name : graph_.nodes[root].role;
    var.cost.assign(candidates(root).size(), 0.0);
    for (const auto& c : candidates(root)) var.choiceNames.push_back(c.op.spec.name);
    prob.vars.push_back(var);
  }
  for (int v = 0; v < N; ++v) {
    auto& cost = prob.vars[p.classOf[v]].cost;
    // Selective checkpointing priced: a recomputed node's forward again.
    const bool again = recompute_ && recompute_->recomputed[v];
    for (size_t k = 0; k < cost.size(); ++k) {
      const Candidate& c = candidates(v)[p.memberChoice[v][k]];
      cost[k] += c.us() + (again ? c.forwardUs : 0.0);
    }
  }
  // Edges: every read of an activation, and of a parameter by a reader other than its first.
  std::map<std::string, std::vector<std::vector<double>>> matrices;
  for (int v = 0; v < N; ++v) {
    const GraphNode& n = graph_.nodes[v];
    for (size_t i = 0; i < n.args.size(); ++i) {
      const std::string& a = n.args[i];
      if (graph_.isInput(a)) continue;
      int u = -1;
      std::function<Layout(int)> from;
      if (graph_.isParameter(a)) {
        u = firstReader_.at(a);
        if (u == v || programWithoutParameterEdges_) continue;
        const GraphNode& owner = graph_.nodes[u];
        const size_t oi = static_cast<size_t>(std::find(owner.args.begin(), owner.args.end(), a) -
                                              owner.args.begin());
        from = [&, u, oi](int k) { return candidates(u)[k].storedLayout(oi); };
      } else {
        const auto [pu, j] = graph_.producer(a);
        u = pu;
        from = [&, u, j = j](int k) { return candidates(u)[k].outputs[j]; };
      }
      const int cu = p.classOf[u], cv = p.classOf[v];
      const bool again = recompute_ && recompute_->recomputed[v];
      const size_t Ku = prob.vars[cu].cost.size(), Kv = prob.vars[cv].cost.size();
      const std::string key =
          std::to_string(cu) + ">" + std::to_string(cv) + ":" +
          (graph_.nodes[u].layer < 0 ? graph_.nodes[u].name : graph_.nodes[u].role) + ">" + n.role +
          ":" + a.substr(a.find(':') == std::string::npos ? a.size() : a.find(':')) + ":" +
          std::to_string(i) + ":" + std::to_string(n.layer == graph_.nodes[u].layer) +
          (again ? ":again" : "");
      auto it = matrices.find(key);
      if (it == matrices.end()) {
        std::vector<Layout> fromLayouts, toLayouts;
        for (size_t ku = 0; ku < Ku; ++ku) fromLayouts.push_back(from(p.memberChoice[u][ku]));
        for (size_t kv = 0; kv < Kv; ++kv) {
          toLayouts.push_back(candidates(v)[p.memberChoice[v][kv]].op.operands[i]);
        }
        auto mat = edgeUsMatrix(graph_.valueShape(a), fromLayouts, toLayouts, again ? 2 : 1);
        if (cu == cv) {  // a class feeding itself pays only its diagonal
          for (size_t ku = 0; ku < Ku; ++ku) {
            for (size_t kv = 0; kv < Kv; ++kv) {
              if (ku != kv) mat[ku][kv] = 0;
            }
          }
        }
        it = matrices.emplace(key, std::move(mat)).first;
      }
      prob.edges.push_back({cu, cv, it->second});
    }
  }
  // Memory rows: the points of the first and last block and outside the blocks.
  const int64_t L = graph_.shape.layers;
  forEachLivenessRow(
      *this, firstReader_, [&](int layer) { return layer < 1 || layer == L - 1; },
      [&](const NodeRow& r) {
        SelectionProblem::MemoryRow row;
        row.what = r.what;
        std::map<int, std::vector<double>> byClass;
        for (const auto& [v, b] : r.terms) {
          auto& acc = byClass[p.classOf[v]];
          acc.resize(prob.vars[p.classOf[v]].cost.size(), 0.0);
          for (size_t k = 0; k < acc.size(); ++k) acc[k] += (*b)[p.memberChoice[v][k]];
        }
        for (auto& [c, b] : byClass) row.terms.emplace_back(c, std::move(b));
        // Pairs of nodes become pairs of their classes (of one class: its diagonal).
        std::map<std::pair<int, int>, std::vector<std::vector<double>>> byPair;
        for (const auto& pr : r.pairs) {
          const int cu = p.classOf[pr.u], cv = p.classOf[pr.v];
          const size_t Ku = prob.vars[cu].cost.size(), Kv = prob.vars[cv].cost.size();
          auto [it, fresh] = byPair.try_emplace({cu, cv}, Ku, std::vector<double>(Kv, 0.0));
          for (size_t a = 0; a < Ku; ++a) {
            for (size_t b = 0; b < Kv; ++b) {
              if (cu == cv && a != b) continue;
              it->second[a][b] += (*pr.bytes)[p.memberChoice[pr.u][a]][p.memberChoice[pr.v][b]];
            }
          }
        }
        for (auto& [ends, b] : byPair) {
          row.pairs.push_back({ends.first, ends.second, std::move(b)});
        }
        prob.memory.push_back(std::move(row));
      });
  return p;
}

std::vector<int> ShardingModel::planOf(const Program& p, const std::vector<int>& selection) const {
  std::vector<int> choice(graph_.nodes.size());
  for (size_t v = 0; v < choice.size(); ++v) choice[v] = p.memberChoice[v][selection[p.classOf[v]]];
  return choice;
}

}  // namespace sb::strategies::autoshard
