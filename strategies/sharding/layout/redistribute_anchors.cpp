// The anchors the redistribution planner is compared with (redistribute_anchors.h): ColossalAI's
// greedy walk, DTensor's axis-by-axis rules, and the planner's comparison with them. Apart from
// the planner (redistribute.cpp) since planning never uses them.

#include "strategies/sharding/layout/redistribute_anchors.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>

#include "strategies/sharding/layout/redistribute_internal.h"

namespace sb::harness {
namespace {

// ColossalAI's _DimSpec difference for a 2-D mesh (shape_consistency's build_difference_2d_dict).
constexpr double kAllGatherCost = 20, kShardCost = 5, kStepPenalty = 6;

double colossalDimDiff(const std::vector<int>& s, const std::vector<int>& t) {
  const size_t ls = s.size(), lt = t.size();
  if (s == t) return 0;
  if (ls == lt + 1 && std::equal(t.begin(), t.end(), s.begin())) return kAllGatherCost;
  if (ls + 1 == lt && std::equal(s.begin(), s.end(), t.begin()) &&
      std::find(s.begin(), s.end(), t.back()) == s.end()) {
    return kShardCost;
  }
  if (ls == lt) return kAllGatherCost + kStepPenalty + kShardCost;
  if (ls + 2 == lt) return kShardCost + kStepPenalty + kShardCost;
  if (ls == lt + 2) return kAllGatherCost + kStepPenalty + kAllGatherCost;
  if (ls + 1 == lt) {
    return kAllGatherCost + kStepPenalty + kShardCost + kStepPenalty + kShardCost;
  }
  return kAllGatherCost + kStepPenalty + kAllGatherCost + kStepPenalty + kShardCost;
}

bool colossalKnows(const Layout& l) {
  if (!l.partialAxes().empty()) return false;
  for (const auto& axes : l.dimAxes()) {
    if (!std::is_sorted(axes.begin(), axes.end())) return false;  // S10
  }
  return true;
}

double colossalDiff(const Layout& a, const Layout& b) {
  double d = 0;
  for (int i = 0; i < a.ndim(); ++i) d += colossalDimDiff(a.axesOf(i), b.axesOf(i));
  return d;
}

// get_all_one_step_transform_spec: all-gathers, then all-to-alls, then shards.
std::vector<RedistStep> colossalOneStep(const Layout& l, int meshNdim) {
  std::vector<RedistStep> out;
  const int nd = l.ndim();
  for (int d = 0; d < nd; ++d) {
    const auto& axes = l.axesOf(d);
    if (!axes.empty()) out.push_back({StepKind::kAllGather, {axes.back()}, d, -1});
  }
  for (int f = 0; f + 1 < nd; ++f) {
    for (int b = f + 1; b < nd; ++b) {
      const auto& fl = l.axesOf(f);
      const auto& bl = l.axesOf(b);
      if (fl.empty() && bl.empty()) continue;
      if (fl.size() >= 2 || bl.size() >= 2) continue;              // S01 never moves
      if (!fl.empty() && !bl.empty() && fl[0] >= bl[0]) continue;  // would make S10
      if (bl.empty()) {
        out.push_back({StepKind::kAllToAll, fl, f, b});
      } else {
        out.push_back({StepKind::kAllToAll, bl, b, f});
      }
    }
  }
  const auto free = replicatedAxes(l, meshNdim);
  for (int d = 0; d < nd; ++d) {
    const auto& axes = l.axesOf(d);
    for (int a : free) {
      if (!axes.empty() && a <= axes.back()) continue;
      out.push_back({StepKind::kSlice, {a}, d, -1});
    }
  }
  return out;
}

}  // namespace

std::optional<std::vector<RedistStep>> colossalGreedySteps(const Layout& from, const Layout& to,
                                                           int meshNdim) {
  if (meshNdim > 2 || !colossalKnows(from) || !colossalKnows(to)) return std::nullopt;
  constexpr int kMaxTransformSteps = 20;
  std::vector<RedistStep> steps;
  if (from == to) return steps;
  Layout cur = from;
  for (int total = 0; total <= kMaxTransformSteps; ++total) {
    double best = INFINITY;
    std::optional<RedistStep> chosen;
    Layout next = cur;
    for (const auto& st : colossalOneStep(cur, meshNdim)) {
      const auto cand = applyStep(cur, st);
      if (!cand) continue;
      if (*cand == to) {
        steps.push_back(st);
        return steps;
      }
      const double diff = colossalDiff(*cand, to);
      if (diff <= best) {  // ColossalAI keeps the last of equally good candidates
        best = diff;
        chosen = st;
        next = *cand;
      }
    }
    if (!chosen) return std::nullopt;
    steps.push_back(*chosen);
    cur = next;
  }
  return std::nullopt;
}

std::optional<std::vector<RedistStep>> dtensorSteps(const Layout& from, const Layout& to,
                                                    int meshNdim) {
  if (!from.meshOrdered() || !to.meshOrdered()) return std::nullopt;
  const int nd = from.ndim();
  auto current = from.placements(meshNdim);
  const auto target = to.placements(meshNdim);
  std::vector<RedistStep> steps;
  Layout layout = from;
  // One transform: mesh axis `i` from its current placement to `t`, checked against what DTensor
  // believes the layout to be afterwards.
  const auto transform = [&](int i, const Placement& t) -> bool {
    const Placement& c = current[i];
    RedistStep st;
    st.axes = {i};
    if (t.kind == Placement::Kind::kReplicate) {
      if (c.kind == Placement::Kind::kPartial) {
        st.kind = StepKind::kAllReduce;
      } else {
        st.kind = StepKind::kAllGather;
        st.dim = c.dim;
      }
    } else if (t.kind == Placement::Kind::kShard) {
      if (c.kind == Placement::Kind::kPartial) {
        st.kind = StepKind::kReduceScatter;
        st.dim = t.dim;
      } else if (c.kind == Placement::Kind::kReplicate) {
        st.kind = StepKind::kSlice;
        st.dim = t.dim;
      } else {
        st.kind = StepKind::kAllToAll;
        st.dim = c.dim;
        st.toDim = t.dim;
      }
    } else {
      if (c.kind != Placement::Kind::kReplicate) return false;  // Shard -> Partial: refused
      st.kind = StepKind::kPartition;
    }
    const auto next = applyStep(layout, st);
    current[i] = t;
    if (!next || *next != Layout::fromPlacements(current, nd)) return false;
    layout = *next;
    steps.push_back(st);
    return true;
  };
  bool sharded = false;
  for (const auto& p : current) sharded = sharded || p.kind == Placement::Kind::kShard;
  if (sharded) {
    for (int i = meshNdim - 1; i >= 0; --i) {
      Placement t = target[i];
      if (t.kind == Placement::Kind::kShard) {
        std::vector<int> cur, tgt;
        for (int j = 0; j < i; ++j) {
          if (current[j].kind == Placement::Kind::kShard && current[j].dim == t.dim)
            cur.push_back(j);
          if (target[j].kind == Placement::Kind::kShard && target[j].dim == t.dim) tgt.push_back(j);
        }
        if (cur != tgt) t = Placement::replicate();
      }
      if (!(current[i] == t) && !transform(i, t)) return std::nullopt;
    }
  }
  for (int i = 0; i < meshNdim; ++i) {
    if (!(current[i] == target[i]) && !transform(i, target[i])) return std::nullopt;
  }
  return steps;
}

namespace {

// A plan and its anchors for one pair, as JSON.
nlohmann::json anchorJson(const RedistGeometry& g, const RedistCostModel& model,
                          const std::optional<std::vector<RedistStep>>& steps, const Layout& from) {
  if (!steps) return nullptr;
  const auto p = planFromSteps(g, from, *steps, model);
  return {{"path", p.path()},
          {"steps", p.steps.size()},
          {"predicted_bytes_max_rank", p.maxRankBytes(g)},
          {"predicted_time_us", p.predictedUs}};
}

}  // namespace

nlohmann::json anchorPlansJson(const RedistGeometry& g, const Layout& from, const Layout& to,
                               const RedistCostModel& model) {
  const int meshNdim = static_cast<int>(g.mesh.size());
  return {
      {"colossalai_greedy", anchorJson(g, model, colossalGreedySteps(from, to, meshNdim), from)},
      {"dtensor", anchorJson(g, model, dtensorSteps(from, to, meshNdim), from)}};
}

nlohmann::json compareWithAnchors(const RedistGeometry& g, const RedistCostModel& model,
                                  PlanObjective objective, const CompareLimits& limits) {
  const int ndim = static_cast<int>(g.shape.size());
  const int meshNdim = static_cast<int>(g.mesh.size());
  // Every ordered pair of layouts with at most one partial axis.
  const auto layouts = enumerateLayouts(ndim, meshNdim, 1);
  struct Tally {
    int pairs = 0, cheaper = 0, equal = 0, dearer = 0;
    double saved = 0, bestSaving = 0;       // bytes saved, summed; the largest relative saving
    double planBytes = 0, anchorBytes = 0;  // sums over pairs: past int64 on large tensors
  };
  Tally colossal, dtensor;
  nlohmann::json worse = nlohmann::json::array();
  const auto tally = [&](Tally& t, const char* name, const RedistPlan& plan,
                         const std::optional<std::vector<RedistStep>>& steps, const Layout& from) {
    if (!steps) return;
    const auto p = planFromSteps(g, from, *steps, model);
    const int64_t ours = plan.maxRankBytes(g), theirs = p.maxRankBytes(g);
    ++t.pairs;
    t.planBytes += static_cast<double>(ours);
    t.anchorBytes += static_cast<double>(theirs);
    if (ours < theirs) {
      ++t.cheaper;
      t.saved += static_cast<double>(theirs - ours);
      t.bestSaving = std::max(t.bestSaving, 1.0 - static_cast<double>(ours) / theirs);
    } else if (ours == theirs) {
      ++t.equal;
    } else {
      ++t.dearer;
      worse.push_back({{"anchor", name},
                       {"from", plan.from.sequence()},
                       {"to", plan.to.sequence()},
                       {"plan_bytes", ours},
                       {"anchor_bytes", theirs}});
    }
  };
  const auto start = std::chrono::steady_clock::now();
  auto lastReport = start;
  const size_t total = layouts.size() * layouts.size();
  size_t done = 0;
  for (const auto& a : layouts) {
    for (const auto& b : layouts) {
      const auto now = std::chrono::steady_clock::now();
      const double elapsed = std::chrono::duration<double>(now - start).count();
      if (limits.maxSeconds > 0 && elapsed > limits.maxSeconds) {
        throw CompareStopped("stopped at the time limit of " + std::to_string(limits.maxSeconds) +
                             " s after " + std::to_string(done) + " of " + std::to_string(total) +
                             " ordered pairs of " + std::to_string(layouts.size()) + " layouts");
      }
      if (limits.progress && now - lastReport >= std::chrono::seconds(1)) {
        limits.progress(done, total);
        lastReport = now;
      }
      ++done;
      const auto plan = planRedistribution(g, a, b, model, objective);
      tally(colossal, "colossalai_greedy", plan, colossalGreedySteps(a, b, meshNdim), a);
      tally(dtensor, "dtensor", plan, dtensorSteps(a, b, meshNdim), a);
    }
  }
  const auto tallyJson = [](const Tally& t) -> nlohmann::json {
    return {{"pairs_with_a_path", t.pairs},
            {"plan_cheaper", t.cheaper},
            {"plan_equal", t.equal},
            {"plan_more_bytes", t.dearer},
            {"plan_bytes_total", t.planBytes},
            {"anchor_bytes_total", t.anchorBytes},
            {"mean_saving_where_cheaper", t.cheaper ? t.saved / t.cheaper : 0.0},
            {"largest_relative_saving", t.bestSaving}};
  };
  return {{"layouts", layouts.size()},
          {"pairs", layouts.size() * layouts.size()},
          {"colossalai_greedy", tallyJson(colossal)},
          {"dtensor", tallyJson(dtensor)},
          {"plan_more_bytes_than_an_anchor", worse}};
}

}  // namespace sb::harness
