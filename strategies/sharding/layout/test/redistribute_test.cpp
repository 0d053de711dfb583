// The redistribution planner: its steps and their transposes, its optimum against an
// exhaustive search, and its paths against ColossalAI's and DTensor's.

#include <gtest/gtest.h>

#include <functional>
#include <map>

#include "strategies/sharding/layout/redistribute.h"
#include "strategies/sharding/layout/redistribute_anchors.h"

namespace sb::harness {
namespace {

TEST(Redistribute, ColossalAIsDocumentedGreedyPathIsReproduced) {
  // shape_consistency's docstring: mesh 4x4, shape (64, 32, 16), [R, S01, R] -> [S01, R, R]
  // goes through [R, S0, R] and [S0, R, R].
  const Layout from = Layout::parse("[R, S01, R]", 3, 2);
  const Layout to = Layout::parse("[S01, R, R]", 3, 2);
  const auto steps = colossalGreedySteps(from, to, 2);
  ASSERT_TRUE(steps);
  const RedistGeometry g{{64, 32, 16}, {4, 4}, 4};
  EXPECT_EQ(planFromSteps(g, from, *steps, {}).path(),
            "[R, S01, R] -> [R, S0, R] -> [S0, R, R] -> [S01, R, R]");
}

TEST(Redistribute, AMultiAxisShardMovesInOneAllToAll) {
  const RedistGeometry g{{64, 32, 16}, {4, 4}, 4};
  const Layout from = Layout::parse("[R, S01, R]", 3, 2);
  const Layout to = Layout::parse("[S01, R, R]", 3, 2);
  const RedistPlan p = planRedistribution(g, from, to, {});
  ASSERT_EQ(p.steps.size(), 1u) << p.path();
  EXPECT_EQ(p.steps[0].kind, StepKind::kAllToAll);
  EXPECT_EQ(p.steps[0].axes, (std::vector<int>{0, 1}));
  // Each rank sends its whole piece once: 64 * 32 * 16 * 4 bytes over 16 ranks.
  EXPECT_EQ(p.maxRankBytes(g), 64 * 32 * 16 * 4 / 16);
  // The greedy path gathers axis 1 (twice the piece), then moves and slices: 8x the bytes.
  const auto greedy = planFromSteps(g, from, *colossalGreedySteps(from, to, 2), {});
  EXPECT_EQ(greedy.maxRankBytes(g), 8 * p.maxRankBytes(g));
}

TEST(Redistribute, EveryTransposedStepMapsTheDualOfItsOutputToTheDualOfItsInput) {
  for (int meshNdim : {1, 2, 3}) {
    for (const Layout& l : enumerateLayouts(3, meshNdim, meshNdim)) {
      for (const RedistStep& st : candidateSteps(l, meshNdim)) {
        const auto after = applyStep(l, st);
        ASSERT_TRUE(after) << st.toString() << " on " << l.sequence();
        const auto back = applyStep(after->dual(meshNdim), transposeStep(st));
        ASSERT_TRUE(back) << st.toString() << " on " << l.sequence();
        EXPECT_EQ(*back, l.dual(meshNdim)) << st.toString() << " on " << l.sequence();
      }
    }
  }
}

TEST(Redistribute, StepBytesFollowTheCommunicatorsConvention) {
  // 13 rows of 4 floats over 4 ranks: pieces of 4, 4, 4, 1 rows.
  const RedistGeometry g{{13, 4}, {4}, 4};
  const Layout s0 = Layout::parse("[S0, R]", 2, 1);
  const RedistStep gather{StepKind::kAllGather, {0}, 0, -1};
  for (int r = 0; r < 4; ++r) {
    // An all-gather counts the gathered output: the whole tensor on every rank.
    EXPECT_EQ(stepComm(g, s0, gather, r).bytes, 13 * 4 * 4);
  }
  const RedistStep move{StepKind::kAllToAll, {0}, 0, 1};
  // An all-to-all counts the send buffer: each rank's own piece.
  EXPECT_EQ(stepComm(g, s0, move, 0).bytes, 4 * 4 * 4);
  EXPECT_EQ(stepComm(g, s0, move, 3).bytes, 1 * 4 * 4);
  const RedistStep slice{StepKind::kSlice, {0}, 0, -1};
  EXPECT_FALSE(stepComm(g, Layout(2), slice, 0).collective);
}

// The cost of a plan in one objective: the planner's additive per-step measure.
double planCost(const RedistGeometry& g, const RedistPlan& p, const RedistCostModel& m,
                PlanObjective o) {
  double c = 0;
  for (size_t i = 0; i < p.steps.size(); ++i) {
    if (o == PlanObjective::kTime) {
      c += m.stepUs(g, p.layouts[i], p.steps[i]);
    } else {
      double worst = 0;
      for (int r = 0; r < g.ranks(); ++r) {
        worst =
            std::max(worst, static_cast<double>(stepComm(g, p.layouts[i], p.steps[i], r).bytes));
      }
      c += worst;
    }
  }
  return c;
}

// Exhaustive: every sequence of up to `depth` steps from `from`, the cheapest cost found for
// each layout reached.
std::map<Layout, double> bruteForce(const RedistGeometry& g, const Layout& from, int depth,
                                    const RedistCostModel& m, PlanObjective o) {
  const int meshNdim = static_cast<int>(g.mesh.size());
  std::map<Layout, double> best;
  std::function<void(const Layout&, double, int)> walk = [&](const Layout& l, double cost,
                                                             int left) {
    auto it = best.find(l);
    if (it == best.end() || cost < it->second) best[l] = cost;
    if (left == 0) return;
    for (const RedistStep& st : candidateSteps(l, meshNdim)) {
      const Layout next = *applyStep(l, st);
      double c = 0;
      if (o == PlanObjective::kTime) {
        c = m.stepUs(g, l, st);
      } else {
        for (int r = 0; r < g.ranks(); ++r) {
          c = std::max(c, static_cast<double>(stepComm(g, l, st, r).bytes));
        }
      }
      walk(next, cost + c, left - 1);
    }
  };
  walk(from, 0, depth);
  return best;
}

void expectPlannerEqualsBruteForce(const RedistGeometry& g, int ndim, int depth) {
  const int meshNdim = static_cast<int>(g.mesh.size());
  const RedistCostModel model;
  for (PlanObjective o : {PlanObjective::kTime, PlanObjective::kBytes}) {
    for (const Layout& from : enumerateLayouts(ndim, meshNdim, 1)) {
      const auto best = bruteForce(g, from, depth, model, o);
      for (const Layout& to : enumerateLayouts(ndim, meshNdim, 1)) {
        const RedistPlan p = planRedistribution(g, from, to, model, o);
        const double ours = planCost(g, p, model, o);
        ASSERT_TRUE(best.count(to)) << to.sequence() << " unreachable in " << depth << " steps";
        const double theirs = best.at(to);
        const double tol = 1e-9 * std::max(1.0, theirs);
        // Never worse than any sequence the search found; and where the plan is short enough
        // for the search to see it, exactly its optimum.
        EXPECT_LE(ours, theirs + tol) << p.path();
        if (static_cast<int>(p.steps.size()) <= depth) {
          EXPECT_NEAR(ours, theirs, tol) << from.sequence() << " -> " << to.sequence();
        }
      }
    }
  }
}

TEST(Redistribute, ThePlannerFindsTheExhaustiveOptimumOnA1DMesh) {
  expectPlannerEqualsBruteForce({{6, 5, 3}, {4}, 4}, 3, 5);
}

TEST(Redistribute, ThePlannerFindsTheExhaustiveOptimumOnA2x2Mesh) {
  expectPlannerEqualsBruteForce({{8, 6}, {2, 2}, 4}, 2, 4);
}

TEST(Redistribute, ThePlanNeverMovesMoreBytesThanColossalAIOrDTensor) {
  for (const std::vector<int64_t>& mesh :
       {std::vector<int64_t>{2, 2}, std::vector<int64_t>{2, 4}}) {
    const RedistGeometry g{{64, 32, 16}, mesh, 4};
    const auto layouts = enumerateLayouts(3, 2, 1);
    int colossal = 0, dtensor = 0, cheaper = 0;
    for (const Layout& a : layouts) {
      for (const Layout& b : layouts) {
        const RedistPlan p = planRedistribution(g, a, b, {});
        EXPECT_EQ(p.to, b);
        for (const auto& steps : {colossalGreedySteps(a, b, 2), dtensorSteps(a, b, 2)}) {
          if (!steps) continue;
          const RedistPlan anchor = planFromSteps(g, a, *steps, {});
          EXPECT_EQ(anchor.to, b) << anchor.path();
          EXPECT_LE(p.maxRankBytes(g), anchor.maxRankBytes(g))
              << p.path() << " vs " << anchor.path();
          cheaper += p.maxRankBytes(g) < anchor.maxRankBytes(g);
        }
        colossal += colossalGreedySteps(a, b, 2).has_value();
        dtensor += dtensorSteps(a, b, 2).has_value();
      }
    }
    // ColossalAI has no partial sums: 16 of the 24 layouts, 256 pairs. DTensor refuses to
    // turn a shard into pending sums, so some pairs with a partial target have no path.
    EXPECT_EQ(colossal, 256);
    EXPECT_GT(dtensor, 400);
    EXPECT_GT(cheaper, 100);
  }
}

TEST(Redistribute, AStepNamingAnAxisTwiceCannotAct) {
  const Layout partial = Layout::parse("[R, R] P1", 2, 2);
  EXPECT_FALSE(applyStep(partial, {StepKind::kAllReduce, {1, 1}, -1, -1}));
  EXPECT_FALSE(applyStep(partial, {StepKind::kReduceScatter, {1, 1}, 0, -1}));
  EXPECT_FALSE(applyStep(Layout(2), {StepKind::kSlice, {0, 0}, 0, -1}));
  EXPECT_FALSE(applyStep(Layout(2), {StepKind::kSlice, {-1}, 0, -1}));
}

TEST(Redistribute, AnUnknownStepIsRefusedNamingIt) {
  const RedistGeometry g{{8, 8}, {2}, 4};
  const RedistStep gatherNothing{StepKind::kAllGather, {0}, 0, -1};
  try {
    planFromSteps(g, Layout(2), {gatherNothing}, {});
    FAIL() << "an all-gather of a replicated tensor was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("all_gather"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace sb::harness
