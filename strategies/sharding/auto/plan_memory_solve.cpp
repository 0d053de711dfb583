// What solving asks of the plan's replay (plan_memory.h): the edges a plan runs, every rank's
// peak on a threads world of the mesh (one replay per class of ranks alike), the plan's memory
// prediction, and which operators' replays are checked to the byte.

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "harness/comm/mesh.h"
#include "harness/comm/threads_backend.h"
#include "strategies/sharding/auto/plan_memory.h"

namespace sb::strategies::autoshard {

using harness::Layout;
using reference::GraphNode;

std::vector<std::string> unverifiedOperators(const reference::Graph& g) {
  static const std::set<std::string> checked = {
      "embedding", "add",  "layer_norm", "addmm",   "view",   "permute",
      "transpose", "bmm",  "softmax",    "dropout", "gelu",   "mm",
      "mul",       "silu", "rms_norm",   "rope",    "matmul", "contiguous"};
  std::set<std::string> out;
  for (const auto& n : g.nodes) {
    if (!checked.count(n.shape.op)) {
      const std::string schema = n.shape.attrs.value("schema", std::string("aten"));
      out.insert(n.shape.op == "aten" ? schema.substr(0, schema.find('(')) : n.shape.op);
    }
  }
  return {out.begin(), out.end()};
}

void ShardingPlan::predictMemory(const ShardingModel& m) {
  livenessPeakBytes = m.peakBytes(choice);
  predictedPeakBytes = livenessPeakBytes;
  replayedPeakBytes.clear();
  notReplayed.clear();
  if (m.rowsWithoutParameters()) {  // the planted fault: the model's rows are all it has,
    notReplayed = "planted fault rows_without_parameters";  // trusted as a replay would be
    replayedPeakBytes.assign(1, livenessPeakBytes);
    return;
  }
  try {
    replayedPeakBytes = replayPlanPeaks(m, choice);
    predictedPeakBytes = *std::max_element(replayedPeakBytes.begin(), replayedPeakBytes.end());
  } catch (const PlanMemoryUnknown& e) {
    notReplayed = e.what();
  }
}

std::vector<PlanEdge> planEdges(const ShardingModel& model, const std::vector<int>& choice) {
  std::vector<PlanEdge> edges;
  const auto& g = model.graph();
  const harness::RedistCostModel cm = model.redistModel();
  const auto es = static_cast<int64_t>(c10::elementSize(model.options().dtype));
  // Repeated blocks repeat their edges: each (shape, from, to) planned once.
  std::map<std::tuple<std::vector<int64_t>, Layout, Layout>,
           std::pair<harness::RedistPlan, harness::RedistPlan>>
      planned;
  for (size_t v = 0; v < g.nodes.size(); ++v) {
    const auto& n = g.nodes[v];
    const Candidate& cand = model.candidates(static_cast<int>(v))[choice[v]];
    for (size_t i = 0; i < n.args.size(); ++i) {
      const auto from = model.valueLayout(n.args[i], choice);
      if (!from || *from == cand.op.operands[i]) continue;
      PlanEdge e;
      e.node = static_cast<int>(v);
      e.operand = i;
      e.geometry = {g.valueShape(n.args[i]), model.mesh(), es};
      const auto key = std::make_tuple(e.geometry.shape, *from, cand.op.operands[i]);
      auto it = planned.find(key);
      if (it == planned.end()) {
        it = planned
                 .emplace(key, std::make_pair(
                                   harness::planRedistribution(e.geometry, *from,
                                                               cand.op.operands[i], cm,
                                                               harness::PlanObjective::kTime),
                                   harness::planRedistribution(e.geometry, cand.op.operands[i],
                                                               *from, cm,
                                                               harness::PlanObjective::kTime)))
                 .first;
      }
      e.forward = it->second.first;
      e.backward = it->second.second;
      // An operand no gradient reaches (an attention bias from a mask input, a routing mask)
      // has no backward: autograd never calls the edge's, so it moves nothing.
      if (!g.requiresGrad(n.args[i])) {
        const Layout& at = cand.op.operands[i];
        e.backward = harness::RedistPlan{at, at, {}, {at}, 0.0};
      }
      edges.push_back(std::move(e));
    }
  }
  return edges;
}

std::vector<int64_t> replayPlanPeaks(const ShardingModel& model, const std::vector<int>& choice) {
  const std::vector<PlanEdge> edges = planEdges(model, choice);
  const harness::DeviceMesh mesh(model.mesh());
  const auto& g = model.graph();
  // Ranks whose every operand and output has the same local sizes replay alike (their groups'
  // sizes are the mesh's): one replay per such class. Each distinct (shape, layout) of the
  // plan is boxed once per rank.
  std::set<std::pair<std::vector<int64_t>, Layout>> placed;
  for (size_t v = 0; v < g.nodes.size(); ++v) {
    const GraphNode& n = g.nodes[v];
    const Candidate& c = model.candidates(static_cast<int>(v))[choice[v]];
    for (size_t i = 0; i < n.args.size(); ++i) {
      placed.emplace(g.valueShape(n.args[i]), c.op.operands[i]);
      placed.emplace(g.valueShape(n.args[i]), c.storedLayout(i));
    }
    const auto shapes = n.shape.outputs();
    for (size_t j = 0; j < shapes.size(); ++j) placed.emplace(shapes[j], c.outputs[j]);
  }
  // The redistributions' intermediate layouts too: a rank's pieces on the way may differ
  // where its operands' do not (a dimension split unevenly over two axes, one gathered first).
  for (const auto& e : edges) {
    for (const auto* p : {&e.forward, &e.backward}) {
      for (const Layout& l : p->layouts) placed.emplace(e.geometry.shape, l);
    }
  }
  std::map<std::vector<int64_t>, int> classes;
  std::vector<int> representative(static_cast<size_t>(mesh.size()));
  for (int rank = 0; rank < mesh.size(); ++rank) {
    std::vector<int64_t> key;
    const auto coords = mesh.coords(rank);
    for (const auto& [shape, layout] : placed) {
      for (int64_t d : layout.box(shape, model.mesh(), coords).length) key.push_back(d);
    }
    representative[static_cast<size_t>(rank)] = classes.emplace(key, rank).first->second;
  }
  // A selective checkpointing policy the search prices: the plan's step with it.
  std::optional<RecomputePolicy> policy;
  if (const RecomputePricing* rp = model.recomputePricing(); rp && rp->replayFor) {
    policy = rp->replayFor(choice);
  }
  harness::ThreadsWorld world{mesh};
  std::vector<int64_t> peaks(static_cast<size_t>(world.mesh().size()), 0);
  std::vector<std::string> unknown(peaks.size());
  world.run([&](harness::RankContext& ctx) {
    if (representative[static_cast<size_t>(ctx.rank())] != ctx.rank()) return;
    try {
      int64_t held = 0;
      const int64_t peak =
          replayPlanStep(model, choice, edges, ctx, model.options().dtype, nullptr, false, &held,
                         policy ? &*policy : nullptr);
      peaks[static_cast<size_t>(ctx.rank())] = held + peak;
    } catch (const PlanMemoryUnknown& e) {
      unknown[static_cast<size_t>(ctx.rank())] = e.what();
    }
  });
  for (const auto& u : unknown) {
    if (!u.empty()) throw PlanMemoryUnknown(u);
  }
  for (size_t r = 0; r < peaks.size(); ++r)
    peaks[r] = peaks[static_cast<size_t>(representative[r])];
  return peaks;
}

}  // namespace sb::strategies::autoshard
