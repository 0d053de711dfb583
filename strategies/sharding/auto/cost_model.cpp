// The cost model of auto-sharding (model.h): a ShardingModel's candidates and their prices,
// the edges' redistribution costs, a plan's predicted step, and the cost options from a case's
// parameters. The memory side is liveness.cpp; the integer program over these prices is
// program.cpp.

#include "strategies/sharding/auto/model.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <set>

#include "harness/comm/mesh.h"
#include "harness/error.h"
#include "strategies/sharding/auto/model_internal.h"
#include "strategies/sharding/layout/redistribute.h"

namespace sb::strategies::autoshard {
namespace {

using harness::Box;
using harness::InputError;
using harness::Layout;
using reference::Graph;
using reference::GraphNode;
using Axes = std::vector<int>;

}  // namespace

bool allReplicated(const ResolvedOp& r) {
  for (const auto& l : r.operands) {
    if (l != Layout(l.ndim())) return false;
  }
  for (const auto& l : r.outputs) {
    if (l != Layout(l.ndim())) return false;
  }
  return true;
}

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
  std::map<std::string, std::shared_ptr<const std::vector<Candidate>>> byShape;
  for (size_t v = 0; v < graph_.nodes.size(); ++v) {
    const GraphNode& n = graph_.nodes[v];
    // The model's inputs take no gradient (only parameters and values computed from them do),
    // so autograd never runs the all-reduce of such an operand's partial gradient: a node that
    // reads one is priced without it, and so is not the same candidate set as a node of
    // the same shape that reads a computed value.
    std::string inputArgs;
    for (const auto& a : n.args) {
      // 'o': a parameter this node owns (it may be stored sharded further: ZeRO-3 candidates).
      const bool owned = graph_.isParameter(a) && firstReader_.at(a) == static_cast<int>(v);
      inputArgs += owned ? 'o' : graph_.requiresGrad(a) ? '-' : 'i';
    }
    const std::string key =
        n.shape.toString() + "|" + nlohmann::json(n.shape.attrs).dump() + "|" + inputArgs;
    auto it = byShape.find(key);
    if (it != byShape.end()) {  // the same candidates, shared
      candidates_.push_back(it->second);
      continue;
    }
    std::vector<OpStrategySpec> specs = opStrategySpecs(n.shape, static_cast<int>(mesh_.size()));
    std::vector<Candidate> cands;
    bool replicated = false;
    for (const auto& spec : specs) {
      if (spec.variant.rfind("fault", 0) == 0) continue;
      // A view that gathers its input whole (ColossalAI's FULLY REPLICATED view) holds the
      // gathered copy, which the liveness model does not count: the plan would promise too
      // little. The replicated layouts it reaches are candidates anyway.
      if (spec.gatherInput) continue;
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
      spec.colossalName = "replicated";
      spec.set = "beyond";
      spec.gatherInput = false;
      spec.buffers.clear();
      spec.variant.clear();
      spec.degenerateAxis = -1;
      spec.meshMustBeFull = false;
      spec.meshDims = {static_cast<int>(mesh_.size())};
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
      for (size_t i = 0; i < n.args.size() && i < c.op.gradPartial.size(); ++i) {
        if (!graph_.requiresGrad(n.args[i])) c.op.gradPartial[i].clear();
      }
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
      c.forwardUs = c.computeUs / 3 + c.localUs / 2;
      for (const auto& part : opCommParts(c.op, mesh_, 0, options_.dtype)) {
        if (!part.backward) c.forwardUs += commUs(part.axes, part.comm);
      }
    }
    addStoredVariants(static_cast<int>(v), cands);
    auto shared = std::make_shared<const std::vector<Candidate>>(std::move(cands));
    byShape[key] = shared;
    candidates_.push_back(std::move(shared));
  }
}

// ZeRO-3 / FSDP candidates: for each candidate of a node that owns parameters it reads whole,
// one more whose such parameters are stored split over every mesh axis (of extent > 1), on
// their first dimension those axes divide, gathered at use and their gradients redistributed
// back (priced as the edge between the two layouts). Named after the candidate:
// "<strategy> zero(<stored layouts>)".
void ShardingModel::addStoredVariants(int v, std::vector<Candidate>& cands) const {
  const GraphNode& n = graph_.nodes[static_cast<size_t>(v)];
  // An imported operator's replay does not know what its kernel keeps of a gathered copy.
  if (n.shape.op == "aten") return;
  std::vector<size_t> owned;
  for (size_t i = 0; i < n.args.size(); ++i) {
    if (graph_.isParameter(n.args[i]) && firstReader_.at(n.args[i]) == v) owned.push_back(i);
  }
  std::vector<int> axes;  // every mesh axis that splits anything
  for (int a = 0; a < static_cast<int>(mesh_.size()); ++a) {
    if (mesh_[static_cast<size_t>(a)] > 1) axes.push_back(a);
  }
  if (owned.empty() || axes.empty()) return;
  const int64_t parts = harness::DeviceMesh(mesh_).groupSize(axes);
  const size_t base = cands.size();
  for (size_t k = 0; k < base; ++k) {
    Candidate z = cands[k];
    std::string names;
    for (size_t i : owned) {
      const Layout& read = z.op.operands[i];
      // FSDP's case: a parameter every rank reads whole. (Stored variants of the split ones too
      // doubled the 4x4x4 LLaMA-8B program and kept CBC from its gap for minutes.)
      if (read != Layout(read.ndim())) continue;
      const auto shape = graph_.valueShape(n.args[i]);
      for (size_t d = 0; d < shape.size(); ++d) {
        if (shape[d] % parts != 0) continue;
        std::vector<std::vector<int>> dims(shape.size());
        dims[d] = axes;
        z.stored[i] = Layout(dims, {});
        z.commUs += edgeUs(shape, z.stored[i], read);
        z.forwardUs += edgeUsMatrix(shape, {z.stored[i]}, {read}, 2)[0][0] -
                       edgeUs(shape, z.stored[i], read);  // the gather again
        names += (names.empty() ? "" : ",") + z.stored[i].compact();
        break;
      }
    }
    if (z.stored.empty()) continue;
    z.op.spec.name += " zero(" + names + ")";
    cands.push_back(std::move(z));
  }
}

int ShardingModel::findCandidate(int node, const std::string& strategy) const {
  const auto& c = candidates(node);
  for (size_t k = 0; k < c.size(); ++k) {
    if (c[k].op.spec.name == strategy) return static_cast<int>(k);
  }
  return -1;
}

int ShardingModel::replicatedCandidate(int node) const {
  const auto& c = candidates(node);
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

int ShardingModel::LayoutGraph::idOf(const Layout& l) {
  const auto [it, fresh] = id.emplace(l, static_cast<int>(layouts.size()));
  if (fresh) {
    layouts.push_back(l);
    steps.emplace_back();
    expanded.push_back(false);
  }
  return it->second;
}

ShardingModel::LayoutGraph& ShardingModel::layoutGraph(const std::vector<int64_t>& shape) const {
  auto [it, fresh] = layoutGraphs_.try_emplace(shape);
  if (fresh) it->second.shape = shape;
  return it->second;
}

// The planner's costs from layout `from` to every layout (one Dijkstra over the planner's
// steps, priced as it prices them), cached per source.
const std::vector<double>& ShardingModel::distancesFrom(LayoutGraph& g, int from) const {
  if (auto it = g.distances.find(from); it != g.distances.end()) return it->second;
  const harness::RedistGeometry geo{g.shape, mesh_,
                                    static_cast<int64_t>(c10::elementSize(options_.dtype))};
  const harness::RedistCostModel cm = redistModel();
  const int meshNdim = static_cast<int>(mesh_.size());
  constexpr double kInf = std::numeric_limits<double>::infinity();
  std::vector<double> dist(g.layouts.size(), kInf);
  std::set<std::pair<double, int>> queue;
  dist[static_cast<size_t>(from)] = 0;
  queue.insert({0.0, from});
  while (!queue.empty()) {
    const auto [d, l] = *queue.begin();
    queue.erase(queue.begin());
    if (!g.expanded[static_cast<size_t>(l)]) {
      g.expanded[static_cast<size_t>(l)] = true;
      const Layout here = g.layouts[static_cast<size_t>(l)];
      std::vector<std::pair<int, double>> out;
      for (const auto& st : harness::candidateSteps(here, meshNdim)) {
        const auto next = harness::applyStep(here, st);
        if (next) out.emplace_back(g.idOf(*next), cm.stepUs(geo, here, st));
      }
      g.steps[static_cast<size_t>(l)] = std::move(out);
      dist.resize(g.layouts.size(), kInf);
    }
    for (const auto& [next, us] : g.steps[static_cast<size_t>(l)]) {
      const double nd = d + us;
      double& best = dist[static_cast<size_t>(next)];
      if (nd < best) {
        if (best < kInf) queue.erase({best, next});
        best = nd;
        queue.insert({nd, next});
      }
    }
  }
  dist.resize(g.layouts.size(), kInf);
  return g.distances.emplace(from, std::move(dist)).first->second;
}

double ShardingModel::edgeUs(const std::vector<int64_t>& shape, const Layout& from,
                             const Layout& to) const {
  if (from == to) return 0;
  return edgeUsMatrix(shape, {from}, {to})[0][0];
}

std::vector<std::vector<double>> ShardingModel::edgeUsMatrix(const std::vector<int64_t>& shape,
                                                             const std::vector<Layout>& from,
                                                             const std::vector<Layout>& to,
                                                             int forwardTimes) const {
  LayoutGraph& g = layoutGraph(shape);
  std::vector<int> f, t;
  for (const auto& l : from) f.push_back(g.idOf(l));
  for (const auto& l : to) t.push_back(g.idOf(l));
  // Every source's distances first (a Dijkstra may name new layouts; the cached vectors stay).
  std::map<int, const std::vector<double>*> dist;
  for (const auto* ids : {&f, &t}) {
    for (int id : *ids) {
      if (!dist.count(id)) dist[id] = &distancesFrom(g, id);
    }
  }
  const auto at = [](const std::vector<double>& d, int i) {
    return static_cast<size_t>(i) < d.size() ? d[static_cast<size_t>(i)]
                                             : std::numeric_limits<double>::infinity();
  };
  std::vector<std::vector<double>> m(from.size(), std::vector<double>(to.size(), 0.0));
  for (size_t a = 0; a < f.size(); ++a) {
    const auto& there = *dist.at(f[a]);
    for (size_t b = 0; b < t.size(); ++b) {
      if (f[a] != t[b]) m[a][b] = forwardTimes * at(there, t[b]) + at(*dist.at(t[b]), f[a]);
    }
  }
  return m;
}

std::optional<Layout> ShardingModel::valueLayout(const std::string& value,
                                                 const std::vector<int>& choice) const {
  if (graph_.isInput(value)) return std::nullopt;
  if (graph_.isParameter(value)) {
    const int v = firstReader_.at(value);
    const GraphNode& n = graph_.nodes[v];
    for (size_t i = 0; i < n.args.size(); ++i) {
      if (n.args[i] == value) return candidates(v)[choice[v]].storedLayout(i);
    }
  }
  const auto [p, j] = graph_.producer(value);
  return candidates(p)[choice[p]].outputs[j];
}

double ShardingModel::stepUs(const std::vector<int>& choice) const {
  double us = stepOverheadUs();
  std::vector<bool> recomputed;
  if (recompute_) {
    recomputed = recompute_->recomputedFor ? recompute_->recomputedFor(choice)
                                           : recompute_->recomputed;
  }
  for (size_t v = 0; v < graph_.nodes.size(); ++v) {
    const Candidate& c = candidates(v)[choice[v]];
    us += c.us();
    const GraphNode& n = graph_.nodes[v];
    // A node a selective checkpointing policy recomputes: its forward and its operands'
    // redistributions again.
    const bool again = v < recomputed.size() && recomputed[v];
    if (again) us += c.forwardUs;
    for (size_t i = 0; i < n.args.size(); ++i) {
      if (graph_.isInput(n.args[i])) continue;
      if (graph_.isParameter(n.args[i]) && firstReader_.at(n.args[i]) == static_cast<int>(v))
        continue;
      us += edgeUsMatrix(graph_.valueShape(n.args[i]), {*valueLayout(n.args[i], choice)},
                         {c.op.operands[i]}, again ? 2 : 1)[0][0];
    }
  }
  return us;
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
    // Bounded below as well: a bandwidth of 1e-300 GB/s prices a transfer at 1e300 us, past
    // what the integer program can hold (CBC asserts on costs of 1e25 and more).
    if (!v.is_number() || !(v.get<double>() >= kMinBandwidthGBps) ||
        !(v.get<double>() <= kMaxBandwidthGBps)) {
      throw InputError(std::string("params.") + key + ": expected a bandwidth in GB/s from 1e-06 " +
                       "to 1e+06, got " + v.dump());
    }
    *field = v.get<double>();
  }
  return o;
}

}  // namespace sb::strategies::autoshard
