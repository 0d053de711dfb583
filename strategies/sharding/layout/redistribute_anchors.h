#pragma once

// The anchors the redistribution planner is compared with: ColossalAI's greedy walk and
// DTensor's axis-by-axis rules, and the comparison of the planner's plans with theirs that
// `stratbench solve redistribute` prints. A file of its own because neither anchor plans
// anything here: they are the references the planner (redistribute.h) is measured against.

#include <cstddef>
#include <functional>
#include <optional>
#include <stdexcept>
#include <vector>

#include <nlohmann/json.hpp>

#include "strategies/sharding/layout/placement.h"
#include "strategies/sharding/layout/redistribute.h"

namespace sb::harness {

// The anchors, as step lists in the planner's vocabulary (redistribute.h).
//
// ColossalAI's shape-consistency manager: a greedy walk that, from the current sharding spec,
// takes among all one-step all-gathers, all-to-alls and shards the one whose spec difference to
// the target is smallest (its 2-D mesh difference table: all-gather 20, shard 5, a step 6). It
// has no reduce-scatter or partial sums, never moves a multi-axis shard ("S01") in an
// all-to-all, and only knows R, S0, S1 and S01 per dimension. Nullopt where it has no path
// (partial sums, a mesh of more than two axes, S10) or gives up after its step limit.
std::optional<std::vector<RedistStep>> colossalGreedySteps(const Layout& from, const Layout& to,
                                                           int meshNdim);
// DTensor's redistribute_local_tensor: mesh axis by mesh axis (innermost first for axes whose
// nested shards are misaligned, then outermost first), one single-axis collective per axis
// whose placement changes. Nullopt where DTensor refuses (Shard -> Partial) or for a layout
// not nested in mesh order.
std::optional<std::vector<RedistStep>> dtensorSteps(const Layout& from, const Layout& to,
                                                    int meshNdim);

// Both anchors' paths from `from` to `to`, each priced by `model`, as
// {"colossalai_greedy": ..., "dtensor": ...}: each its path, steps, predicted bytes of the
// busiest rank and predicted time, or null where that anchor has no path.
nlohmann::json anchorPlansJson(const RedistGeometry& g, const Layout& from, const Layout& to,
                               const RedistCostModel& model);

// The planner (for `objective`) against both anchors over every ordered pair of layouts with at
// most one partial axis (`solve redistribute --compare-anchors`): "layouts", "pairs", per anchor
// ("colossalai_greedy", "dtensor") how many pairs it has a path for and how many of those the
// plan moves fewer, as many or more bytes than it, and "plan_more_bytes_than_an_anchor" listing
// the last kind. Throws std::invalid_argument where the planner finds no path.
//
// Bounded by `limits`: past maxSeconds (> 0) it throws CompareStopped saying how far it got;
// `progress`, where set, is called about once a second with the pairs done and their total.
// Byte totals are sums over every pair, kept in floating point: they outgrow an int64 on large
// tensors.
struct CompareLimits {
  double maxSeconds = 0;  // 0: no limit
  std::function<void(size_t done, size_t total)> progress;
};
class CompareStopped : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
nlohmann::json compareWithAnchors(const RedistGeometry& g, const RedistCostModel& model,
                                  PlanObjective objective, const CompareLimits& limits = {});

}  // namespace sb::harness
