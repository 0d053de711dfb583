#include "strategies/sharding/layout/redistribute.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <queue>
#include <stdexcept>
#include <tuple>

#include "strategies/sharding/layout/redistribute_internal.h"
#include "strategies/sharding/layout/redistribute_testing.h"

namespace sb::harness {
namespace {

// The planted pricing fault (redistribute_testing.h); set only by ScopedPriceFault.
PriceFault gPriceFault = PriceFault::kNone;

std::string axesDigits(const std::vector<int>& axes) {
  std::string s;
  for (int a : axes) s += std::to_string(a);
  return s;
}

bool isSuffix(const std::vector<int>& list, const std::vector<int>& tail) {
  return !tail.empty() && tail.size() <= list.size() &&
         std::equal(tail.begin(), tail.end(), list.end() - tail.size());
}

// Every non-empty subset of `axes`, in increasing order within each subset.
std::vector<std::vector<int>> subsets(const std::vector<int>& axes) {
  std::vector<std::vector<int>> out;
  const int n = static_cast<int>(axes.size());
  for (int mask = 1; mask < (1 << n); ++mask) {
    std::vector<int> s;
    for (int i = 0; i < n; ++i) {
      if (mask & (1 << i)) s.push_back(axes[i]);
    }
    out.push_back(s);
  }
  return out;
}

// Every non-empty ordered sequence of distinct elements of `axes`.
std::vector<std::vector<int>> arrangements(const std::vector<int>& axes) {
  std::vector<std::vector<int>> out;
  for (auto s : subsets(axes)) {
    std::sort(s.begin(), s.end());
    do {
      out.push_back(s);
    } while (std::next_permutation(s.begin(), s.end()));
  }
  return out;
}

std::vector<int> withoutSuffix(const std::vector<int>& list, size_t k) {
  return std::vector<int>(list.begin(), list.end() - k);
}

}  // namespace

std::vector<int> replicatedAxes(const Layout& l, int meshNdim) {
  std::vector<int> out;
  for (int a = 0; a < meshNdim; ++a) {
    if (!l.isPartial(a) && l.shardDimOf(a) < 0) out.push_back(a);
  }
  return out;
}

const char* stepKindName(StepKind k) {
  switch (k) {
    case StepKind::kSlice:
      return "slice";
    case StepKind::kAllGather:
      return "all_gather";
    case StepKind::kAllToAll:
      return "all_to_all";
    case StepKind::kAllReduce:
      return "all_reduce";
    case StepKind::kReduceScatter:
      return "reduce_scatter";
    case StepKind::kPartition:
      return "partition";
    case StepKind::kPad:
      return "pad";
  }
  return "?";
}

std::optional<Collective> RedistStep::collective() const {
  switch (kind) {
    case StepKind::kAllGather:
      return Collective::kAllGather;
    case StepKind::kAllToAll:
      return Collective::kAllToAll;
    case StepKind::kAllReduce:
      return Collective::kAllReduce;
    case StepKind::kReduceScatter:
      return Collective::kReduceScatter;
    default:
      return std::nullopt;
  }
}

std::string RedistStep::toString() const {
  const std::string t = axesDigits(axes);
  std::string s = stepKindName(kind);
  switch (kind) {
    case StepKind::kSlice:
      return s + "(dim " + std::to_string(dim) + ": R -> S" + t + ")";
    case StepKind::kAllGather:
      return s + "(dim " + std::to_string(dim) + ": S" + t + " -> R)";
    case StepKind::kAllToAll:
      return s + "(S" + t + " from dim " + std::to_string(dim) + " to dim " +
             std::to_string(toDim) + ")";
    case StepKind::kAllReduce:
      return s + "(P" + t + " -> R)";
    case StepKind::kReduceScatter:
      return s + "(P" + t + " -> S" + t + " on dim " + std::to_string(dim) + ")";
    case StepKind::kPartition:
      return s + "(R -> P" + t + ")";
    case StepKind::kPad:
      return s + "(dim " + std::to_string(dim) + ": S" + t + " -> P" + t + ")";
  }
  return s;
}

std::optional<Layout> applyStep(const Layout& from, const RedistStep& st) {
  if (st.axes.empty()) return std::nullopt;
  {
    std::vector<int> sorted = st.axes;
    std::sort(sorted.begin(), sorted.end());
    if (sorted.front() < 0 || std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
      return std::nullopt;  // a negative axis, or one named twice
    }
  }
  const int nd = from.ndim();
  const bool dimOk = st.dim >= 0 && st.dim < nd;
  auto dims = from.dimAxes();
  auto partial = from.partialAxes();
  const auto isReplicated = [&](int a) { return !from.isPartial(a) && from.shardDimOf(a) < 0; };
  const auto allOf = [&](auto pred) { return std::all_of(st.axes.begin(), st.axes.end(), pred); };
  const bool sorted = std::is_sorted(st.axes.begin(), st.axes.end());
  switch (st.kind) {
    case StepKind::kSlice:
      if (!dimOk || !allOf(isReplicated)) return std::nullopt;
      dims[st.dim].insert(dims[st.dim].end(), st.axes.begin(), st.axes.end());
      break;
    case StepKind::kAllGather:
      if (!dimOk || !isSuffix(dims[st.dim], st.axes)) return std::nullopt;
      dims[st.dim] = withoutSuffix(dims[st.dim], st.axes.size());
      break;
    case StepKind::kAllToAll:
      if (!dimOk || st.toDim < 0 || st.toDim >= nd || st.toDim == st.dim ||
          !isSuffix(dims[st.dim], st.axes)) {
        return std::nullopt;
      }
      dims[st.dim] = withoutSuffix(dims[st.dim], st.axes.size());
      dims[st.toDim].insert(dims[st.toDim].end(), st.axes.begin(), st.axes.end());
      break;
    case StepKind::kAllReduce:
      if (!sorted || !allOf([&](int a) { return from.isPartial(a); })) return std::nullopt;
      for (int a : st.axes) partial.erase(std::find(partial.begin(), partial.end(), a));
      break;
    case StepKind::kReduceScatter:
      if (!dimOk || !allOf([&](int a) { return from.isPartial(a); })) return std::nullopt;
      for (int a : st.axes) partial.erase(std::find(partial.begin(), partial.end(), a));
      dims[st.dim].insert(dims[st.dim].end(), st.axes.begin(), st.axes.end());
      break;
    case StepKind::kPartition:
      if (!sorted || !allOf(isReplicated)) return std::nullopt;
      partial.insert(partial.end(), st.axes.begin(), st.axes.end());
      break;
    case StepKind::kPad:
      if (!dimOk || !isSuffix(dims[st.dim], st.axes)) return std::nullopt;
      dims[st.dim] = withoutSuffix(dims[st.dim], st.axes.size());
      partial.insert(partial.end(), st.axes.begin(), st.axes.end());
      break;
  }
  // A repeated axis is caught by the constructor; it cannot arise from a valid step.
  return Layout(std::move(dims), std::move(partial));
}

RedistStep transposeStep(const RedistStep& st) {
  RedistStep t = st;
  switch (st.kind) {
    case StepKind::kSlice:
      t.kind = StepKind::kPad;
      break;
    case StepKind::kPad:
      t.kind = StepKind::kSlice;
      break;
    case StepKind::kAllGather:
      t.kind = StepKind::kReduceScatter;
      break;
    case StepKind::kReduceScatter:
      t.kind = StepKind::kAllGather;
      break;
    case StepKind::kAllToAll:
      std::swap(t.dim, t.toDim);
      break;
    case StepKind::kAllReduce:
    case StepKind::kPartition:
      break;
  }
  return t;
}

std::vector<RedistStep> candidateSteps(const Layout& from, int meshNdim) {
  std::vector<RedistStep> out;
  const int nd = from.ndim();
  const auto repl = replicatedAxes(from, meshNdim);
  const auto& partial = from.partialAxes();
  for (int d = 0; d < nd; ++d) {
    const auto& axes = from.axesOf(d);
    for (size_t k = 1; k <= axes.size(); ++k) {
      const std::vector<int> tail(axes.end() - k, axes.end());
      out.push_back({StepKind::kAllGather, tail, d, -1});
      for (int e = 0; e < nd; ++e) {
        if (e != d) out.push_back({StepKind::kAllToAll, tail, d, e});
      }
      out.push_back({StepKind::kPad, tail, d, -1});
    }
    for (const auto& seq : arrangements(repl)) out.push_back({StepKind::kSlice, seq, d, -1});
    for (const auto& seq : arrangements(partial)) {
      out.push_back({StepKind::kReduceScatter, seq, d, -1});
    }
  }
  for (const auto& s : subsets(partial)) out.push_back({StepKind::kAllReduce, s, -1, -1});
  for (const auto& s : subsets(repl)) out.push_back({StepKind::kPartition, s, -1, -1});
  return out;
}

int RedistGeometry::ranks() const {
  int64_t n = 1;
  for (int64_t m : mesh) n *= m;
  return static_cast<int>(n);
}

std::vector<int64_t> RedistGeometry::coords(int rank) const {
  std::vector<int64_t> c(mesh.size());
  int64_t r = rank;
  for (int a = static_cast<int>(mesh.size()) - 1; a >= 0; --a) {
    c[a] = r % mesh[a];
    r /= mesh[a];
  }
  return c;
}

int64_t RedistGeometry::groupSize(const std::vector<int>& axes) const {
  int64_t n = 1;
  for (int a : axes) n *= mesh.at(a);
  return n;
}

std::vector<int64_t> RedistGeometry::memberCoords(std::vector<int64_t> coords,
                                                  const std::vector<int>& axes,
                                                  int64_t index) const {
  for (int i = static_cast<int>(axes.size()) - 1; i >= 0; --i) {
    coords[axes[i]] = index % mesh[axes[i]];
    index /= mesh[axes[i]];
  }
  return coords;
}

int64_t RedistGeometry::localBytes(const Layout& l, int rank) const {
  return l.box(shape, mesh, coords(rank)).numel() * elemSize;
}

std::vector<int64_t> RedistGeometry::localBytesOfRanks(const Layout& l) const {
  // The planner prices every step of every layout pair by this: no allocation per rank.
  const int n = ranks();
  std::vector<int64_t> out(static_cast<size_t>(n), elemSize), length;
  std::vector<int64_t> c;
  for (int d = 0; d < l.ndim(); ++d) {
    const auto& axes = l.axesOf(d);
    if (axes.empty()) {  // whole on every rank
      for (auto& b : out) b *= shape[static_cast<size_t>(d)];
      continue;
    }
    // A dimension's piece depends on the coordinates of the axes that split it only: found
    // once per coordinate of those axes (their mixed-radix index), on the first rank there.
    length.assign(static_cast<size_t>(groupSize(axes)), -1);
    for (int r = 0; r < n; ++r) {
      int64_t key = 0;
      int64_t rest = r;
      c.assign(mesh.size(), 0);
      for (int a = static_cast<int>(mesh.size()) - 1; a >= 0; --a) {
        c[static_cast<size_t>(a)] = rest % mesh[static_cast<size_t>(a)];
        rest /= mesh[static_cast<size_t>(a)];
      }
      for (int a : axes) key = key * mesh[static_cast<size_t>(a)] + c[static_cast<size_t>(a)];
      int64_t& len = length[static_cast<size_t>(key)];
      if (len < 0) len = l.box(shape, mesh, c).length[static_cast<size_t>(d)];
      out[static_cast<size_t>(r)] *= len;
    }
  }
  return out;
}

StepComm stepComm(const RedistGeometry& g, const Layout& before, const RedistStep& st, int rank) {
  StepComm c;
  c.collective = st.collective();
  if (!c.collective || g.groupSize(st.axes) == 1) return {};
  const auto after = applyStep(before, st);
  if (!after) throw std::invalid_argument(st.toString() + " cannot act on " + before.sequence());
  switch (st.kind) {
    case StepKind::kAllGather:
      c.bytes = g.localBytes(*after, rank);  // the gathered output
      break;
    default:
      c.bytes = g.localBytes(before, rank);  // the input (all-reduce: the buffer)
      break;
  }
  return c;
}

int64_t stepBytes(const RedistGeometry& g, const Layout& before, const RedistStep& st) {
  int64_t worst = 0;
  // The planted fault prices a reduce-scatter by its output, all-gather's convention turned
  // around: every plan stays valid, only the planner's choices are misled.
  if (gPriceFault == PriceFault::kReduceScatterPricedByOutput &&
      st.kind == StepKind::kReduceScatter && g.groupSize(st.axes) > 1) {
    const Layout after = *applyStep(before, st);
    for (int r = 0; r < g.ranks(); ++r) worst = std::max(worst, g.localBytes(after, r));
    return worst;
  }
  for (int r = 0; r < g.ranks(); ++r) worst = std::max(worst, stepComm(g, before, st, r).bytes);
  return worst;
}

ScopedPriceFault::ScopedPriceFault(PriceFault fault) : previous_(gPriceFault) {
  gPriceFault = fault;
}
ScopedPriceFault::~ScopedPriceFault() { gPriceFault = previous_; }

double RedistCostModel::stepUs(const RedistGeometry& g, const Layout& before,
                               const RedistStep& st) const {
  const int64_t n = g.groupSize(st.axes);
  if (n == 1) return 0;
  double worst = 0;
  const auto after = applyStep(before, st);
  if (!after) throw std::invalid_argument(st.toString() + " cannot act on " + before.sequence());
  if (!st.collective()) {
    for (const int64_t b : g.localBytesOfRanks(*after)) {
      worst = std::max(worst, b / (copyGBps * 1e3));
    }
    return worst;
  }
  // Each rank's bytes as stepComm counts them (an all-gather its output, the rest their input;
  // the planted fault times an all-gather by what each rank sends, not what it gathers).
  const bool byOutput =
      st.kind == StepKind::kAllGather && gPriceFault != PriceFault::kAllGatherTimedByInput;
  const std::vector<int64_t> bytes = g.localBytesOfRanks(byOutput ? *after : before);
  for (int r = 0; r < g.ranks(); ++r) {
    StepComm c;
    c.collective = st.collective();
    c.bytes = bytes[static_cast<size_t>(r)];
    std::optional<double> us;
    if (profile != nullptr) {
      CommStats stats;
      stats.add(*c.collective, c.bytes);
      us = profile->commUs(st.axes, stats);
    }
    if (!us) {
      us = latencyUs +
           c.bytes * CostProfile::busFactor(*c.collective, static_cast<int>(n)) / (busGBps * 1e3);
    }
    worst = std::max(worst, *us);
  }
  return worst;
}

nlohmann::json RedistCostModel::toJson() const {
  if (profile != nullptr) {
    return {{"kind", "profile"},
            {"profile", profile->backend + " " + profile->mesh + " on " + profile->host},
            {"local_copy_GBps", copyGBps}};
  }
  return {{"kind", "default"},
          {"latency_us", latencyUs},
          {"bus_GBps", busGBps},
          {"local_copy_GBps", copyGBps}};
}

std::string RedistPlan::path() const {
  std::string s;
  for (const auto& l : layouts) s += (s.empty() ? "" : " -> ") + l.sequence();
  return s;
}

std::vector<std::pair<std::vector<int>, CommStats>> RedistPlan::commByGroup(const RedistGeometry& g,
                                                                            int rank,
                                                                            bool backward) const {
  std::vector<std::pair<std::vector<int>, CommStats>> out;
  auto add = [&](const std::vector<int>& axes, const StepComm& c) {
    if (!c.collective) return;
    auto it = std::find_if(out.begin(), out.end(), [&](const auto& p) { return p.first == axes; });
    if (it == out.end()) {
      out.emplace_back(axes, CommStats{});
      it = out.end() - 1;
    }
    it->second.add(*c.collective, c.bytes);
  };
  for (size_t i = 0; i < steps.size(); ++i)
    add(steps[i].axes, stepComm(g, layouts[i], steps[i], rank));
  if (backward) {
    const int meshNdim = static_cast<int>(g.mesh.size());
    for (size_t i = steps.size(); i-- > 0;) {
      const RedistStep t = transposeStep(steps[i]);
      add(t.axes, stepComm(g, layouts[i + 1].dual(meshNdim), t, rank));
    }
  }
  return out;
}

CommStats RedistPlan::comm(const RedistGeometry& g, int rank, bool backward) const {
  CommStats total;
  for (const auto& [axes, st] : commByGroup(g, rank, backward)) {
    for (int i = 0; i < kNumCollectives; ++i) {
      total.entries[i].calls += st.entries[i].calls;
      total.entries[i].bytes += st.entries[i].bytes;
    }
  }
  return total;
}

LocalWork RedistPlan::localWork(const RedistGeometry& g, int rank, bool backward) const {
  const int meshNdim = static_cast<int>(g.mesh.size());
  LocalWork w;
  const auto add = [&](const Layout& before, const RedistStep& st) {
    const int64_t n = g.groupSize(st.axes);
    if (n == 1) return;
    const Layout after = *applyStep(before, st);
    const int64_t in = g.localBytes(before, rank), out = g.localBytes(after, rank);
    switch (st.kind) {
      case StepKind::kSlice:
      case StepKind::kPartition:
      case StepKind::kAllReduce:  // the copy it reduces in place
        w += {1, out};
        break;
      case StepKind::kPad:  // zeros, then the piece
        w += {2, out + in};
        break;
      case StepKind::kAllGather:  // staged in row order, then each block into place
        if (st.dim != 0) w += {1 + n, in + out};
        break;
      case StepKind::kReduceScatter:  // staged in row order, then the result into place
        if (st.dim != 0) w += {2, in + out};
        break;
      case StepKind::kAllToAll:  // every block out of the piece, every block into place
        w += {2 * n, in + out};
        break;
    }
  };
  for (size_t i = 0; i < steps.size(); ++i) add(layouts[i], steps[i]);
  if (backward) {
    for (size_t i = steps.size(); i-- > 0;) {
      add(layouts[i + 1].dual(meshNdim), transposeStep(steps[i]));
    }
  }
  return w;
}

int64_t RedistPlan::maxRankBytes(const RedistGeometry& g) const {
  int64_t worst = 0;
  for (int r = 0; r < g.ranks(); ++r) worst = std::max(worst, comm(g, r).totalBytes());
  return worst;
}

nlohmann::json RedistPlan::toJson(const RedistGeometry& g, int meshNdim) const {
  nlohmann::json js = nlohmann::json::array();
  for (size_t i = 0; i < steps.size(); ++i) {
    std::vector<int64_t> bytes;
    for (int r = 0; r < g.ranks(); ++r) bytes.push_back(stepComm(g, layouts[i], steps[i], r).bytes);
    const auto coll = steps[i].collective();
    js.push_back({{"step", steps[i].toString()},
                  {"kind", stepKindName(steps[i].kind)},
                  {"collective", coll && g.groupSize(steps[i].axes) > 1
                                     ? nlohmann::json(collectiveName(*coll))
                                     : nlohmann::json(nullptr)},
                  {"mesh_axes", steps[i].axes},
                  {"from", layouts[i].sequence()},
                  {"to", layouts[i + 1].sequence()},
                  {"bytes_per_rank", bytes}});
  }
  std::vector<int64_t> perRank;
  for (int r = 0; r < g.ranks(); ++r) perRank.push_back(comm(g, r).totalBytes());
  nlohmann::json j = {{"from", from.sequence()},
                      {"to", to.sequence()},
                      {"path", path()},
                      {"steps", js},
                      {"predicted_time_us", predictedUs},
                      {"predicted_bytes_per_rank", perRank},
                      {"predicted_bytes_max_rank", maxRankBytes(g)}};
  if (from.meshOrdered()) j["from_dtensor"] = from.dtensor(meshNdim);
  if (to.meshOrdered()) j["to_dtensor"] = to.dtensor(meshNdim);
  return j;
}

RedistPlan planFromSteps(const RedistGeometry& g, const Layout& from,
                         const std::vector<RedistStep>& steps, const RedistCostModel& model) {
  RedistPlan p;
  p.from = from;
  p.layouts = {from};
  for (const auto& st : steps) {
    const auto next = applyStep(p.layouts.back(), st);
    if (!next) {
      throw std::invalid_argument(st.toString() + " cannot act on " + p.layouts.back().sequence());
    }
    p.predictedUs += model.stepUs(g, p.layouts.back(), st);
    p.steps.push_back(st);
    p.layouts.push_back(*next);
  }
  p.to = p.layouts.back();
  return p;
}

RedistPlan planRedistribution(const RedistGeometry& g, const Layout& from, const Layout& to,
                              const RedistCostModel& model, PlanObjective objective) {
  const int meshNdim = static_cast<int>(g.mesh.size());
  // Lexicographic cost: the objective, then the other measure, then the number of steps. Times
  // are compared with a relative tolerance, so that sums taken in another order tie.
  struct Cost {
    double first = 0, second = 0;
    int steps = 0;
  };
  const auto less = [](const Cost& a, const Cost& b) {
    const auto lt = [](double x, double y) { return x < y - 1e-9 * std::max(1.0, std::abs(y)); };
    if (lt(a.first, b.first)) return true;
    if (lt(b.first, a.first)) return false;
    if (lt(a.second, b.second)) return true;
    if (lt(b.second, a.second)) return false;
    return a.steps < b.steps;
  };
  struct Node {
    Cost cost;
    std::optional<Layout> parent;
    RedistStep step;
    bool done = false;
  };
  std::map<Layout, Node> nodes;
  using Entry = std::pair<Cost, Layout>;
  // The heap orders exactly (a strict weak order); the tolerance above only decides relaxations.
  auto cmp = [](const Entry& a, const Entry& b) {
    return std::tie(b.first.first, b.first.second, b.first.steps) <
           std::tie(a.first.first, a.first.second, a.first.steps);
  };
  std::priority_queue<Entry, std::vector<Entry>, decltype(cmp)> queue(cmp);
  nodes[from] = Node{};
  queue.push({Cost{}, from});
  while (!queue.empty()) {
    const auto [cost, layout] = queue.top();
    queue.pop();
    Node& node = nodes[layout];
    if (node.done) continue;
    node.done = true;
    if (layout == to) break;
    for (const auto& st : candidateSteps(layout, meshNdim)) {
      const auto next = applyStep(layout, st);
      if (!next) continue;
      const double us = model.stepUs(g, layout, st);
      const double bytes = static_cast<double>(stepBytes(g, layout, st));
      Cost c = cost;
      c.first += objective == PlanObjective::kTime ? us : bytes;
      c.second += objective == PlanObjective::kTime ? bytes : us;
      c.steps += 1;
      auto it = nodes.find(*next);
      if (it == nodes.end() || (!it->second.done && less(c, it->second.cost))) {
        nodes[*next] = Node{c, layout, st, false};
        queue.push({c, *next});
      }
    }
  }
  auto it = nodes.find(to);
  if (it == nodes.end() || !it->second.done) {
    throw std::invalid_argument("no redistribution from " + from.sequence() + " to " +
                                to.sequence());
  }
  std::vector<RedistStep> steps;
  for (Layout cur = to; cur != from;) {
    const Node& n = nodes.at(cur);
    steps.push_back(n.step);
    cur = *n.parent;
  }
  std::reverse(steps.begin(), steps.end());
  return planFromSteps(g, from, steps, model);
}

}  // namespace sb::harness
