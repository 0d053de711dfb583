// The cost model, the integer program and the plans of auto-sharding (model.h).

#include "strategies/sharding/auto/model.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <set>
#include <tuple>

#include "harness/mesh.h"
#include "harness/redistribute.h"
#include "harness/suite.h"

namespace sb::strategies::autoshard {
namespace {

using harness::Box;
using harness::Layout;
using reference::Graph;
using reference::GraphNode;
using Axes = std::vector<int>;

bool isAliasOp(const std::string& op) {
  return op == "view" || op == "permute" || op == "transpose" || op == "split";
}

bool allReplicated(const ResolvedOp& r) {
  for (const auto& l : r.operands) {
    if (l != Layout(l.ndim())) return false;
  }
  for (const auto& l : r.outputs) {
    if (l != Layout(l.ndim())) return false;
  }
  return true;
}

}  // namespace

ShardingModel::ShardingModel(Graph graph, std::vector<int64_t> mesh, CostOptions options)
    : graph_(std::move(graph)), mesh_(std::move(mesh)), options_(options) {
  for (size_t v = 0; v < graph_.nodes.size(); ++v) {
    const GraphNode& n = graph_.nodes[v];
    for (size_t i = 0; i < n.args.size(); ++i) {
      if (graph_.isParameter(n.args[i]) && !firstReader_.count(n.args[i])) {
        firstReader_[n.args[i]] = static_cast<int>(v);
      }
    }
  }
  // Candidates: the generator's strategies that apply on this mesh and divide evenly, plus a
  // replicated one where the generator has none (bmm).
  std::map<std::string, std::vector<Candidate>> byShape;
  for (const GraphNode& n : graph_.nodes) {
    const std::string key = n.shape.toString() + "|" + nlohmann::json(n.shape.attrs).dump();
    auto it = byShape.find(key);
    if (it != byShape.end()) {
      candidates_.push_back(it->second);
      continue;
    }
    std::vector<OpStrategySpec> specs = opStrategySpecs(n.shape);
    std::vector<Candidate> cands;
    bool replicated = false;
    for (const auto& spec : specs) {
      if (spec.variant.rfind("fault", 0) == 0) continue;
      if (!opNotApplicable(spec, n.shape, mesh_).empty()) continue;
      ResolvedOp r = resolveOp(spec, n.shape, mesh_);
      if (!r.problem.empty()) continue;
      replicated |= allReplicated(r);
      Candidate c;
      c.op = r;
      cands.push_back(c);
    }
    if (!replicated && !specs.empty()) {
      OpStrategySpec spec = specs.front();
      spec.name = "replicated";
      spec.set = "beyond";
      spec.variant.clear();
      spec.degenerateAxis = -1;
      spec.meshMustBeFull = false;
      spec.meshDims = {1, 2};
      spec.outputFromShape = false;
      for (auto& l : spec.operandLayouts) l = Layout(l.ndim());
      spec.outputLayouts.clear();
      for (const auto& o : n.shape.outputs())
        spec.outputLayouts.emplace_back(static_cast<int>(o.size()));
      Candidate c;
      c.op = resolveOp(spec, n.shape, mesh_);
      cands.push_back(c);
    }
    for (auto& c : cands) {
      c.outputs = c.op.reducedOutputs();
      const double flops = opFlops(c.op, mesh_, 0);
      if (flops > 0) {
        c.computeUs = options_.profile ? 3 * options_.profile->gemm.latencyUs +
                                             options_.profile->gemm.usPerByte * flops
                                       : flops / (options_.gflops * 1e3);
      }
      for (const auto& [axes, stats] : opCommByGroup(c.op, mesh_, 0, options_.dtype)) {
        c.commUs += commUs(axes, stats);
      }
      c.localUs = copyUs(opLocalWork(c.op, mesh_, 0, options_.dtype));
    }
    byShape[key] = cands;
    candidates_.push_back(cands);
  }
}

int ShardingModel::findCandidate(int node, const std::string& strategy) const {
  const auto& c = candidates_.at(node);
  for (size_t k = 0; k < c.size(); ++k) {
    if (c[k].op.spec.name == strategy) return static_cast<int>(k);
  }
  return -1;
}

int ShardingModel::replicatedCandidate(int node) const {
  const auto& c = candidates_.at(node);
  for (size_t k = 0; k < c.size(); ++k) {
    if (allReplicated(c[k].op)) return static_cast<int>(k);
  }
  return -1;
}

int64_t ShardingModel::bytes(const std::vector<int64_t>& shape, const Layout& l) const {
  const Box b = l.box(shape, mesh_, harness::DeviceMesh(mesh_).coords(0));
  return b.numel() * static_cast<int64_t>(c10::elementSize(options_.dtype));
}

double ShardingModel::commUs(const Axes& axes, const harness::CommStats& stats) const {
  const harness::DeviceMesh mesh(mesh_);
  const int n = static_cast<int>(mesh.groupSize(axes));
  if (n <= 1 || stats.totalCalls() == 0) return 0;
  if (options_.profile) {
    if (const auto us = options_.profile->commUs(axes, stats)) return *us;
  }
  const bool inter = std::find(axes.begin(), axes.end(), 0) != axes.end() && mesh_.size() > 1;
  const double bw = inter ? options_.interGBps : options_.intraGBps;
  double us = 0;
  for (int c = 0; c < harness::kNumCollectives; ++c) {
    const auto& e = stats.entries[c];
    if (e.calls == 0) continue;
    us += static_cast<double>(e.calls) * options_.latencyUs +
          static_cast<double>(e.bytes) *
              harness::CostProfile::busFactor(static_cast<harness::Collective>(c), n) / (bw * 1e3);
  }
  return us;
}

double ShardingModel::copyUs(const harness::LocalWork& w) const {
  if (w.bytes == 0 && w.copies == 0) return 0;
  if (options_.profile) {
    if (const auto us = options_.profile->localUs(w)) return *us;
  }
  return static_cast<double>(w.bytes) / (options_.copyGBps * 1e3);
}

double ShardingModel::stepOverheadUs() const {
  return options_.profile ? options_.profile->stepUs.value_or(0.0) : 0.0;
}

harness::RedistCostModel ShardingModel::redistModel() const {
  harness::RedistCostModel cm;
  cm.latencyUs = options_.latencyUs;
  cm.busGBps = std::min(options_.intraGBps, options_.interGBps);
  cm.copyGBps = options_.copyGBps;
  cm.profile = options_.profile;
  return cm;
}

// The planner's costs from `from` to every layout of a tensor of `shape` (one Dijkstra over
// the planner's steps, priced as it prices them), cached: an edge's cost matrix asks for many
// targets from few sources.
const std::map<Layout, double>& ShardingModel::distancesFrom(const std::vector<int64_t>& shape,
                                                             const Layout& from) const {
  std::string key = from.compact() + "@";
  for (int64_t d : shape) key += std::to_string(d) + ",";
  if (auto it = distances_.find(key); it != distances_.end()) return it->second;
  const harness::RedistGeometry g{shape, mesh_,
                                  static_cast<int64_t>(c10::elementSize(options_.dtype))};
  const harness::RedistCostModel cm = redistModel();
  const int meshNdim = static_cast<int>(mesh_.size());
  std::map<Layout, double> dist;
  std::set<std::pair<double, Layout>> queue;
  dist[from] = 0;
  queue.insert({0.0, from});
  while (!queue.empty()) {
    const auto [d, l] = *queue.begin();
    queue.erase(queue.begin());
    if (d > dist[l]) continue;
    for (const auto& st : harness::candidateSteps(l, meshNdim)) {
      const auto next = harness::applyStep(l, st);
      if (!next) continue;
      const double nd = d + cm.stepUs(g, l, st);
      auto it = dist.find(*next);
      if (it == dist.end() || nd < it->second) {
        if (it != dist.end()) queue.erase({it->second, *next});
        dist[*next] = nd;
        queue.insert({nd, *next});
      }
    }
  }
  return distances_.emplace(key, std::move(dist)).first->second;
}

double ShardingModel::edgeUs(const std::vector<int64_t>& shape, const Layout& from,
                             const Layout& to) const {
  if (from == to) return 0;
  const auto& there = distancesFrom(shape, from);
  const auto& back = distancesFrom(shape, to);
  const auto a = there.find(to), b = back.find(from);
  if (a == there.end() || b == back.end()) return std::numeric_limits<double>::infinity();
  return a->second + b->second;
}

std::optional<Layout> ShardingModel::valueLayout(const std::string& value,
                                                 const std::vector<int>& choice) const {
  if (graph_.isInput(value)) return std::nullopt;
  if (graph_.isParameter(value)) {
    const int v = firstReader_.at(value);
    const GraphNode& n = graph_.nodes[v];
    for (size_t i = 0; i < n.args.size(); ++i) {
      if (n.args[i] == value) return candidates_[v][choice[v]].op.operands[i];
    }
  }
  const auto [p, j] = graph_.producer(value);
  return candidates_[p][choice[p]].outputs[j];
}

double ShardingModel::stepUs(const std::vector<int>& choice) const {
  double us = stepOverheadUs();
  for (size_t v = 0; v < graph_.nodes.size(); ++v) {
    const Candidate& c = candidates_[v][choice[v]];
    us += c.us();
    const GraphNode& n = graph_.nodes[v];
    for (size_t i = 0; i < n.args.size(); ++i) {
      if (graph_.isInput(n.args[i])) continue;
      if (graph_.isParameter(n.args[i]) && firstReader_.at(n.args[i]) == static_cast<int>(v))
        continue;
      us += edgeUs(graph_.valueShape(n.args[i]), *valueLayout(n.args[i], choice), c.op.operands[i]);
    }
  }
  return us;
}

namespace {

// A memory row whose terms name nodes (bytes per candidate of the node).
struct NodeRow {
  std::string what;
  int layer = -1;
  std::vector<std::pair<int, const std::vector<double>*>> terms;
};

// The liveness rows (model.h), each a sum of per-node, per-candidate bytes, handed to `sink`
// one at a time (only those whose node's layer `wants`): a graph of N nodes has 2N of them,
// each of O(N) terms.
void forEachLivenessRow(const ShardingModel& m, const std::map<std::string, int>& firstReader,
                        const std::function<bool(int layer)>& wants,
                        const std::function<void(const NodeRow&)>& sink) {
  const Graph& g = m.graph();
  const int N = static_cast<int>(g.nodes.size());
  const int64_t es = static_cast<int64_t>(c10::elementSize(m.options().dtype));
  const auto coords = harness::DeviceMesh(m.mesh()).coords(0);
  const auto boxBytes = [&](const std::vector<int64_t>& shape, const Layout& l) {
    return static_cast<double>(l.box(shape, m.mesh(), coords).numel() * es);
  };
  const auto perCand = [&](int v, auto fn) {
    std::vector<double> b;
    for (const auto& c : m.candidates(v)) b.push_back(fn(c));
    return b;
  };
  const auto add = [](std::vector<double>& acc, const std::vector<double>& x) {
    if (acc.empty()) acc.assign(x.size(), 0.0);
    for (size_t k = 0; k < x.size(); ++k) acc[k] += x[k];
  };
  // Whether a node's output is a new tensor (views share their input's storage; a view of a
  // permuted tensor copies), and whose storage it lives in.
  std::vector<bool> allocates(N, true);
  std::vector<int> root(N);
  for (int v = 0; v < N; ++v) {
    const GraphNode& n = g.nodes[v];
    root[v] = v;
    if (!isAliasOp(n.shape.op)) continue;
    const auto [p, j] = g.producer(n.args[0]);
    const bool copies = n.shape.op == "view" && p >= 0 &&
                        (g.nodes[p].shape.op == "permute" || g.nodes[p].shape.op == "transpose");
    if (!copies) {
      allocates[v] = false;
      root[v] = p >= 0 ? root[p] : -1;  // -1: a view of a parameter or input
    }
  }
  std::vector<int> lastUse(N, -1);
  std::map<std::string, int> lastReader;
  for (int v = 0; v < N; ++v) {
    for (const auto& a : g.nodes[v].args) {
      lastReader[a] = v;
      const auto [p, j] = g.producer(a);
      if (p >= 0 && root[p] >= 0) lastUse[root[p]] = std::max(lastUse[root[p]], v);
    }
  }
  const int outputNode = g.producer(g.output).first;
  const auto isActivation = [&](const std::string& a) {
    if (g.isInput(a) || g.isParameter(a)) return false;
    return root[g.producer(a).first] >= 0;
  };
  // Per node: its outputs, what it saves, the parameters it owns and the inputs it slices,
  // its activation operands (their gradients), and each owned parameter's gradient.
  std::vector<std::vector<double>> out(N), saved(N), base(N), grads(N);
  std::vector<std::tuple<int, int, std::vector<double>>> paramGrads;  // owner, last reader
  for (int v = 0; v < N; ++v) {
    const GraphNode& n = g.nodes[v];
    out[v] = perCand(v, [&](const Candidate& c) {
      double b = 0;
      const auto shapes = n.shape.outputs();
      for (size_t j = 0; j < shapes.size(); ++j) b += boxBytes(shapes[j], c.outputs[j]);
      return b;
    });
    const auto operand = [&](size_t i) {
      return perCand(v, [&](const Candidate& c) {
        return boxBytes(n.shape.operandShape(c.op.spec.operands[i]), c.op.operands[i]);
      });
    };
    const std::string& op = n.shape.op;
    for (size_t i = 0; i < n.args.size(); ++i) {
      const std::string& a = n.args[i];
      const bool owned = g.isParameter(a) && firstReader.at(a) == v;
      if (owned) paramGrads.emplace_back(v, lastReader.at(a), operand(i));
      if (owned || g.isInput(a)) add(base[v], operand(i));
      if (!isActivation(a)) continue;
      add(grads[v], operand(i));
      if (op == "addmm" || op == "bmm" ||
          (i == 0 && (op == "layer_norm" || op == "gelu" || op == "dropout"))) {
        add(saved[v], operand(i));  // dropout: its mask, of the input's size
      }
    }
    if (op == "layer_norm") {  // the mean and inverse deviation per row, in float
      add(saved[v], perCand(v, [&](const Candidate& c) {
            const Box in = c.op.operands[0].box(n.shape.input, m.mesh(), coords);
            return 2.0 * in.numel() / std::max<int64_t>(1, in.length.back()) * 4;
          }));
    }
    if (op == "softmax") add(saved[v], out[v]);
  }
  NodeRow always;
  for (int v = 0; v < N; ++v) {
    if (!base[v].empty()) always.terms.emplace_back(v, &base[v]);
  }
  always.terms.emplace_back(outputNode, &out[outputNode]);  // the gradient seed
  // Forward: after node t.
  for (int t = 0; t < N; ++t) {
    if (!wants(g.nodes[t].layer)) continue;
    NodeRow r = always;
    r.what = "forward, after " + g.nodes[t].name;
    r.layer = g.nodes[t].layer;
    for (int u = 0; u <= t; ++u) {
      if (!saved[u].empty()) r.terms.emplace_back(u, &saved[u]);
      if (allocates[u] && (lastUse[u] > t || u == outputNode || u == t)) {
        r.terms.emplace_back(u, &out[u]);
      }
    }
    sink(r);
  }
  // Backward: during node t's backward (its saved tensors and its outputs' gradients still
  // held, its operands' gradients made), with the output kept for the results.
  for (int t = N - 1; t >= 0; --t) {
    if (!wants(g.nodes[t].layer)) continue;
    NodeRow r = always;
    r.what = "backward of " + g.nodes[t].name;
    r.layer = g.nodes[t].layer;
    r.terms.emplace_back(outputNode, &out[outputNode]);
    for (int u = 0; u <= t; ++u) {
      if (!saved[u].empty()) r.terms.emplace_back(u, &saved[u]);
      // An activation's gradient, from its last reader's backward to its producer's.
      if (allocates[u] && lastUse[u] >= t) r.terms.emplace_back(u, &out[u]);
    }
    for (const auto& [owner, last, bytes] : paramGrads) {
      if (last >= t) r.terms.emplace_back(owner, &bytes);
    }
    if (!grads[t].empty()) r.terms.emplace_back(t, &grads[t]);
    sink(r);
  }
}

}  // namespace

int64_t ShardingModel::peakBytes(const std::vector<int>& choice) const {
  double peak = 0;
  forEachLivenessRow(
      *this, firstReader_, [](int) { return true; },
      [&](const NodeRow& r) {
        double live = 0;
        for (const auto& [v, b] : r.terms) live += (*b)[choice[v]];
        peak = std::max(peak, live);
      });
  return static_cast<int64_t>(peak);
}

std::vector<std::pair<std::string, int64_t>> ShardingModel::livenessRows(
    const std::vector<int>& choice) const {
  std::vector<std::pair<std::string, int64_t>> rows;
  forEachLivenessRow(
      *this, firstReader_, [](int) { return true; },
      [&](const NodeRow& r) {
        double live = 0;
        for (const auto& [v, b] : r.terms) live += (*b)[choice[v]];
        rows.emplace_back(r.what, static_cast<int64_t>(live));
      });
  return rows;
}

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
      // The same role in another block: the first block's mapping, on the same shapes.
      int first = -1;
      for (int u = 0; u < v && first < 0; ++u) {
        if (graph_.nodes[u].layer >= 0 && graph_.nodes[u].role == n.role) first = u;
      }
      p.classOf[v] = p.classOf[first];
      p.memberChoice[v] = p.memberChoice[first];
      continue;
    }
    // A following node (one activation in, layouts following it) rides on its producer.
    const std::string& op = n.shape.op;
    const bool follower = op == "gelu" || op == "relu" || op == "dropout" || op == "view" ||
                          op == "permute" || op == "transpose";
    if (follower && !graph_.isInput(n.args[0]) && !graph_.isParameter(n.args[0])) {
      const auto [u, j] = graph_.producer(n.args[0]);
      const int c = p.classOf[u];
      std::vector<int> map;
      for (int k : p.memberChoice[u]) {
        const Layout& out = candidates_[u][k].outputs[j];
        int found = -1;
        for (size_t q = 0; q < candidates_[v].size() && found < 0; ++q) {
          if (candidates_[v][q].op.operands[0] == out) found = static_cast<int>(q);
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
    p.memberChoice[v].resize(candidates_[v].size());
    std::iota(p.memberChoice[v].begin(), p.memberChoice[v].end(), 0);
  }
  // Variables: each class's choices, costing its members' nodes.
  auto& prob = p.problem;
  prob.memoryLimit = memoryLimit;
  for (int root : classRoot) {
    SelectionProblem::Var var;
    var.name = graph_.nodes[root].layer < 0 ? graph_.nodes[root].name : graph_.nodes[root].role;
    var.cost.assign(candidates_[root].size(), 0.0);
    for (const auto& c : candidates_[root]) var.choiceNames.push_back(c.op.spec.name);
    prob.vars.push_back(var);
  }
  for (int v = 0; v < N; ++v) {
    auto& cost = prob.vars[p.classOf[v]].cost;
    for (size_t k = 0; k < cost.size(); ++k) cost[k] += candidates_[v][p.memberChoice[v][k]].us();
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
        if (u == v) continue;
        const GraphNode& owner = graph_.nodes[u];
        const size_t oi = static_cast<size_t>(std::find(owner.args.begin(), owner.args.end(), a) -
                                              owner.args.begin());
        from = [&, u, oi](int k) { return candidates_[u][k].op.operands[oi]; };
      } else {
        const auto [pu, j] = graph_.producer(a);
        u = pu;
        from = [&, u, j = j](int k) { return candidates_[u][k].outputs[j]; };
      }
      const int cu = p.classOf[u], cv = p.classOf[v];
      const size_t Ku = prob.vars[cu].cost.size(), Kv = prob.vars[cv].cost.size();
      const std::string key =
          std::to_string(cu) + ">" + std::to_string(cv) + ":" +
          (graph_.nodes[u].layer < 0 ? graph_.nodes[u].name : graph_.nodes[u].role) + ">" + n.role +
          ":" + a.substr(a.find(':') == std::string::npos ? a.size() : a.find(':')) + ":" +
          std::to_string(i) + ":" + std::to_string(n.layer == graph_.nodes[u].layer);
      auto it = matrices.find(key);
      if (it == matrices.end()) {
        std::vector<std::vector<double>> mat(Ku, std::vector<double>(Kv, 0.0));
        const auto shape = graph_.valueShape(a);
        for (size_t ku = 0; ku < Ku; ++ku) {
          const Layout l = from(p.memberChoice[u][ku]);
          for (size_t kv = 0; kv < Kv; ++kv) {
            if (cu == cv && ku != kv) continue;
            mat[ku][kv] = edgeUs(shape, l, candidates_[v][p.memberChoice[v][kv]].op.operands[i]);
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

namespace sb::strategies::autoshard {
namespace {

using harness::InputError;
using harness::Layout;

// Which candidates a hand-written plan family allows (the solver picks the rest).
using Allowed = std::function<bool(int node, const Candidate&)>;

bool onlyDimZero(const Layout& l, int axis) {
  for (int d = 1; d < l.ndim(); ++d) {
    const auto& a = l.axesOf(d);
    if (axis < 0 ? !a.empty() : std::find(a.begin(), a.end(), axis) != a.end()) return false;
  }
  return true;
}

bool endsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Megatron-LM's placement of a parameter: column-parallel query, key, value and MLP input
// projections (their output features split over the tensor-parallel axis), row-parallel output
// projections (their input features split), a vocabulary-parallel embedding and head; the rest
// replicated.
Layout megatronParam(const std::string& name, int ndim, int tp) {
  const auto split = [&](int dim) {
    std::vector<std::vector<int>> d(ndim);
    d[dim] = {tp};
    return Layout(d, {});
  };
  for (const char* col : {"attn.q.", "attn.k.", "attn.v.", "mlp.fc."}) {
    if (name.find(col) != std::string::npos) return split(ndim - 1);
  }
  if (endsWith(name, "attn.proj.weight") || endsWith(name, "mlp.proj.weight")) return split(0);
  if (name == "wte") return split(0);
  if (name == "lm_head.bias") return split(0);
  return Layout(ndim);
}

Allowed allowedFor(const ShardingModel& m, const std::string& algo) {
  const reference::Graph& g = m.graph();
  const int meshNdim = static_cast<int>(m.mesh().size());
  if (algo == "replicated") {
    return [](int, const Candidate& c) { return allReplicated(c.op); };
  }
  if (algo == "data-parallel") {
    // Every parameter replicated, and every node that computes on data (reads an activation or
    // looks up ids) splits its work over every mesh axis: its outputs use them all, along the
    // batch, the sequence or the batched heads, since a replicated weight allows no other.
    std::vector<int> axes;
    for (int a = 0; a < meshNdim; ++a) {
      if (m.mesh()[a] > 1) axes.push_back(a);
    }
    return [&g, axes](int v, const Candidate& c) {
      const auto& n = g.nodes[v];
      bool data = false;
      for (size_t i = 0; i < n.args.size(); ++i) {
        const Layout& l = c.op.operands[i];
        if (g.isParameter(n.args[i]) && l != Layout(l.ndim())) return false;
        data |= !g.isParameter(n.args[i]);
      }
      for (const auto& l : c.outputs) {
        if (!data) {
          if (l != Layout(l.ndim())) return false;  // a parameter's view stays replicated
          continue;
        }
        for (int a : axes) {
          if (l.shardDimOf(a) < 0) return false;
        }
      }
      return true;
    };
  }
  // megatron
  const int tp = meshNdim - 1, dp = meshNdim == 2 ? 0 : -1;
  return [&g, tp, dp](int v, const Candidate& c) {
    const auto& n = g.nodes[v];
    const auto activationOk = [&](const Layout& l) {
      if (dp >= 0 && !onlyDimZero(l, dp)) return false;
      // Tokens ([T, features]) are not split over the tensor-parallel axis: no sequence
      // parallelism in this plan.
      if (l.ndim() == 2) {
        const auto& a = l.axesOf(0);
        if (std::find(a.begin(), a.end(), tp) != a.end()) return false;
      }
      return true;
    };
    for (size_t i = 0; i < n.args.size(); ++i) {
      const Layout& l = c.op.operands[i];
      if (g.isParameter(n.args[i])) {
        if (l != megatronParam(n.args[i], l.ndim(), tp)) return false;
      } else if (!g.isInput(n.args[i]) && !activationOk(l)) {
        return false;
      }
    }
    for (const auto& l : c.outputs) {
      if (!activationOk(l)) return false;
    }
    return true;
  };
}

}  // namespace

const std::vector<std::string>& planAlgos() {
  static const std::vector<std::string> a = {"ilp", "megatron", "data-parallel", "replicated"};
  return a;
}

ShardingPlan solvePlan(const ShardingModel& m, const SolveOptions& o) {
  const auto& algos = planAlgos();
  if (std::find(algos.begin(), algos.end(), o.algo) == algos.end()) {
    throw InputError("--algo '" + o.algo +
                     "' is not one of ilp, megatron, data-parallel, replicated");
  }
  const auto start = std::chrono::steady_clock::now();
  // A hand-written family's plan does not bend to the memory limit: it is solved without one
  // and checked against it below.
  ShardingModel::Program p = m.program(o.algo == "ilp" ? o.memoryLimit : 0);
  // A hand-written family: the program over the candidates it allows (the others priced out
  // of reach), so that its activations take their cheapest layouts.
  constexpr double kBarred = 1e9;
  if (o.algo != "ilp") {
    const Allowed allowed = allowedFor(m, o.algo);
    for (size_t v = 0; v < m.graph().nodes.size(); ++v) {
      auto& cost = p.problem.vars[p.classOf[v]].cost;
      bool any = false;
      for (size_t k = 0; k < cost.size(); ++k) {
        if (!allowed(static_cast<int>(v), m.candidates(v)[p.memberChoice[v][k]])) {
          cost[k] += kBarred;
        } else {
          any = true;
        }
      }
      if (!any) {
        throw NoPlanError(o.algo + ": node " + m.graph().nodes[v].name + " (" +
                              m.graph().nodes[v].shape.toString() +
                              ") has no strategy of that plan on this mesh",
                          0);
      }
    }
  }
  SelectionOptions so;
  so.timeLimitSeconds = o.timeLimitSeconds;
  so.relativeGap = o.relativeGap;
  Selection sel = solveIlp(p.problem, so);
  if (sel.status == "infeasible" || sel.status == "no_solution" || sel.objective >= kBarred) {
    SelectionProblem free = p.problem;
    free.memoryLimit = 0;
    // The least memory of the plans this algorithm may choose: barred choices made too big.
    SelectionProblem::MemoryRow barred;
    barred.what = "choices outside " + o.algo;
    for (size_t c = 0; c < free.vars.size(); ++c) {
      std::vector<double> b;
      for (double cost : free.vars[c].cost) b.push_back(cost >= kBarred ? 1e18 : 0.0);
      barred.terms.emplace_back(static_cast<int>(c), b);
    }
    free.memory.push_back(barred);
    const Selection least = solveMinPeakMemory(free, so);
    throw NoPlanError(o.algo + ": no plan fits " +
                          std::to_string(static_cast<int64_t>(o.memoryLimit)) +
                          " bytes per rank; the least any plan of it needs is " +
                          std::to_string(static_cast<int64_t>(least.peakMemory)) + " bytes",
                      least.peakMemory);
  }
  ShardingPlan plan;
  plan.workload = m.graph().workload;
  plan.mesh = m.mesh();
  plan.choice = m.planOf(p, sel.choice);
  plan.solver.algo = o.algo;
  plan.solver.status = sel.status;
  plan.solver.objectiveUs = sel.objective;
  plan.solver.bound = sel.bound;
  plan.solver.gap = sel.gap;
  plan.solver.seconds = sel.seconds;
  plan.solver.variables = sel.variables;
  plan.solver.constraints = sel.constraints;
  plan.solver.classes = static_cast<int>(p.problem.vars.size());
  plan.solver.memoryLimit = o.memoryLimit;
  plan.solver.programSeconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() - sel.seconds;
  plan.predictedStepUs = m.stepUs(plan.choice);
  plan.predictedPeakBytes = m.peakBytes(plan.choice);
  if (o.memoryLimit > 0 && plan.predictedPeakBytes > o.memoryLimit) {
    throw NoPlanError(
        o.algo + ": no plan fits " + std::to_string(static_cast<int64_t>(o.memoryLimit)) +
            " bytes per rank; its plan needs " + std::to_string(plan.predictedPeakBytes) + " bytes",
        static_cast<double>(plan.predictedPeakBytes));
  }
  return plan;
}

nlohmann::json ShardingPlan::toJson(const ShardingModel& m) const {
  nlohmann::json nodes = nlohmann::json::array();
  const int meshNdim = static_cast<int>(mesh.size());
  for (size_t v = 0; v < choice.size(); ++v) {
    const auto& n = m.graph().nodes[v];
    const Candidate& c = m.candidates(v)[choice[v]];
    const auto place = [&](const Layout& l) {
      nlohmann::json j = {{"sequence", l.sequence()}};
      try {
        j["placements"] = l.dtensor(meshNdim);
      } catch (const std::exception&) {
      }
      return j;
    };
    nlohmann::json args = nlohmann::json::object(), results = nlohmann::json::object();
    for (size_t i = 0; i < n.args.size(); ++i) {
      nlohmann::json a = place(c.op.operands[i]);
      a["value"] = n.args[i];
      args[c.op.spec.operands[i]] = a;
    }
    const auto names = n.outputs();
    for (size_t j = 0; j < names.size(); ++j) results[names[j]] = place(c.outputs[j]);
    nodes.push_back({{"name", n.name},
                     {"op", n.shape.op},
                     {"strategy", c.op.spec.name},
                     {"args", args},
                     {"results", results},
                     {"cost_us", c.us()}});
  }
  return {{"format", "stratbench.sharding_plan/1"},
          {"workload", workload},
          {"shape", shape},
          {"mesh", mesh},
          {"algo", solver.algo},
          {"predicted",
           {{"step_time_us", predictedStepUs}, {"peak_bytes_per_rank", predictedPeakBytes}}},
          {"solver",
           {{"status", solver.status},
            {"objective_us", solver.objectiveUs},
            {"bound_us", solver.bound},
            {"gap", solver.gap},
            {"seconds", solver.seconds},
            {"program_seconds", solver.programSeconds},
            {"total_seconds", solver.totalSeconds},
            {"variables", solver.variables},
            {"constraints", solver.constraints},
            {"classes", solver.classes},
            {"memory_limit_bytes", solver.memoryLimit}}},
          {"nodes", nodes}};
}

ShardingPlan ShardingPlan::fromJson(const nlohmann::json& j, const ShardingModel& m,
                                    const std::string& file) {
  const auto fail = [&](const std::string& key, const std::string& what) {
    throw InputError(file + ": key '" + key + "': " + what);
  };
  if (!j.is_object())
    fail("(top level)", "a plan must be a mapping (as `stratbench solve shard` writes)");
  for (const char* k : {"workload", "mesh", "nodes"}) {
    if (!j.contains(k)) fail(k, "missing");
  }
  if (!j.at("workload").is_string() || j.at("workload").get<std::string>() != m.graph().workload) {
    fail("workload", "expected \"" + m.graph().workload + "\", got " + j.at("workload").dump());
  }
  if (j.at("mesh") != nlohmann::json(m.mesh())) {
    fail("mesh", "expected " + nlohmann::json(m.mesh()).dump() + ", got " + j.at("mesh").dump());
  }
  const auto& nodes = j.at("nodes");
  const size_t N = m.graph().nodes.size();
  if (!nodes.is_array() || nodes.size() != N) {
    fail("nodes", "expected a list of the graph's " + std::to_string(N) + " nodes");
  }
  ShardingPlan plan;
  plan.workload = m.graph().workload;
  plan.mesh = m.mesh();
  for (size_t v = 0; v < N; ++v) {
    const std::string key = "nodes[" + std::to_string(v) + "]";
    const auto& n = nodes[v];
    const auto& g = m.graph().nodes[v];
    if (!n.is_object() || !n.contains("name") || n.at("name") != g.name) {
      fail(key + ".name", "expected \"" + g.name + "\"");
    }
    if (!n.contains("strategy") || !n.at("strategy").is_string())
      fail(key + ".strategy", "missing");
    const int k = m.findCandidate(static_cast<int>(v), n.at("strategy").get<std::string>());
    if (k < 0) {
      fail(key + ".strategy",
           "node " + g.name + " has no strategy " + n.at("strategy").dump() + " on this mesh");
    }
    const Candidate& c = m.candidates(v)[k];
    if (n.contains("args")) {
      for (size_t i = 0; i < c.op.spec.operands.size(); ++i) {
        const std::string& op = c.op.spec.operands[i];
        if (!n.at("args").contains(op)) continue;
        const auto& a = n.at("args").at(op);
        if (!a.contains("sequence") || a.at("sequence") != c.op.operands[i].sequence()) {
          fail(key + ".args." + op + ".sequence",
               "strategy " + c.op.spec.name + " reads it as " + c.op.operands[i].sequence());
        }
      }
    }
    plan.choice.push_back(k);
  }
  plan.shape = j.value("shape", nlohmann::json());
  plan.solver.algo = "file";
  plan.solver.status = j.contains("solver") ? j.at("solver").value("status", "") : "";
  plan.predictedStepUs = m.stepUs(plan.choice);
  plan.predictedPeakBytes = m.peakBytes(plan.choice);
  return plan;
}

CostOptions costOptionsFrom(const nlohmann::json& params, harness::CostProfile* storage,
                            at::ScalarType dtype) {
  CostOptions o;
  o.dtype = dtype;
  if (params.contains("cost_profile")) {
    *storage = harness::CostProfile::fromJson(params.at("cost_profile"), "cost_profile");
    o.profile = storage;
  }
  for (const auto& [key, field] :
       {std::pair<const char*, double*>{"intra_node_bandwidth", &o.intraGBps},
        {"inter_node_bandwidth", &o.interGBps}}) {
    if (!params.contains(key)) continue;
    const auto& v = params.at(key);
    if (!v.is_number() || v.get<double>() <= 0) {
      throw InputError(std::string("params.") + key + ": expected a bandwidth in GB/s (> 0), got " +
                       v.dump());
    }
    *field = v.get<double>();
  }
  return o;
}

}  // namespace sb::strategies::autoshard
