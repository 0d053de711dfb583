#pragma once

// Selective checkpointing's budget solver: given a memory budget for one step (bytes above what
// the step starts with), the saved set that recomputes least, by an integer program over the
// graph's operators solved with CBC (the auto-sharding selection program, ilp.h), its plans
// checked by the plan's exact memory replay with the policy (plan_memory.h); a greedy baseline
// beside it.
//
// The program: per operator of a block that takes a gradient and is not a view (views take
// their storage's decision), keep or recompute, costing its forward's time by the cost model (a
// product's third of its step, another operator's half) where recomputed; one memory row per
// block, where its backward begins: everything the block holds to its backward (each operator's
// outputs where a node of its block saves them, through views to their storage's maker, or its
// own saved tensors; kept, or recomputed at the block's first read) plus what the blocks before
// it keep (those after it are done). A role of the repeated blocks is one variable, how many
// blocks keep it, the last ones (they hold least long). The rows are a model of the peak, not the
// peak: each plan the program chooses is replayed, and the rows' limit is searched by bisection,
// from the least any plan can meet (nothing kept: the least peak a policy reaches here; a budget
// below it is refused, naming it) to everything kept, for the largest whose plan fits the
// budget by the replay; from that plan, each operator it recomputes is kept where the replay
// still fits, the most time saved first. The answer is the fastest plan found that fits (the
// greedy baseline's where that recomputes less); the replay, not the rows, is the prediction.
//
// Greedy: from keeping everything, recompute the kept operator with the most bytes per unit of
// recompute time, replay, repeat until the replay fits.

#include <cstdint>
#include <string>
#include <vector>

#include "strategies/checkpointing/sac/policy.h"
#include "strategies/sharding/auto/model.h"

namespace sb::strategies::sac {

struct BudgetOptions {
  double timeLimitSeconds = 10;  // CBC's, per solve
  int maxRounds = 24;  // programs solved
  // The planted fault budget_ignores_view_base: an operator's outputs saved only through a view
  // count nothing, and the program's first plan is taken without its replay.
  bool ignoreViewBase = false;
};

struct BudgetPlan {
  std::string status;  // optimal, feasible (a round or time limit), infeasible
  std::string chosen = "program";  // or "greedy", where the baseline's plan recomputes less
  Policy policy;       // the plan (meaningful unless infeasible)
  int64_t peak = 0;    // its replayed step peak, bytes above the step's start
  double recomputeUs = 0;
  int rounds = 0;   // programs solved
  int ascents = 0;  // replays of the ascent after them
  int decisions = 0;
  // The least peak any policy reaches here (recompute-all's by the replay), and keep-all's.
  int64_t leastPeak = 0, keepAllPeak = 0;
  // The greedy baseline.
  bool greedyFits = false;
  int64_t greedyPeak = 0;
  double greedyUs = 0;
  double seconds = 0;
};

// The step peak (bytes above its start) of `policy` by the plan's replay, on one rank.
int64_t replayPolicyPeak(const autoshard::ShardingModel& m, const std::vector<int>& choice,
                         const Policy& policy);

BudgetPlan solveBudget(const autoshard::ShardingModel& m, const std::vector<int>& choice,
                       int64_t budgetBytes, const BudgetOptions& options = {});

}  // namespace sb::strategies::sac
