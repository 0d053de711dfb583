// The checkpointing solvers judged by execution: every schedule of a small chain (2 to 5 stages
// of real chain workloads, profiled) is run, its peak measured by the tracking allocator and
// its forwards counted; at every budget those measurements allow, each solver's schedule must
// run within the budget, as it predicted, and rotor's must run no more forwards than the best
// schedule that ran within the budget. checkpoint_solver_test.cpp compares rotor with a brute
// force over the same memory model on chains without the step's own terms (chain.h:
// output_kept, loss_grad_kept), so an error shared by the model and rotor's table, or a
// schedule rotor misses where those terms decide what fits, passes there.
//
// The objective is the work the solvers minimise with every forward priced 1 and every
// backward 0: the chain keeps the profiled sizes and takes unit forward times, so a schedule's
// predicted time is its number of forwards and the executed one is the count of stage forwards
// that ran.

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <set>

#include "harness/measure/memory.h"
#include "reference/chain_nets.h"
#include "strategies/checkpointing/profiler.h"
#include "strategies/checkpointing/run_schedule.h"
#include "strategies/checkpointing/solvers.h"
#include "strategies/checkpointing/solvers_testing.h"

namespace sb::strategies::checkpointing {
namespace {

// The cached networks keep their gradients (and the profiler its tensors) alive between tests:
// they are counted against a rank of their own, which no runner uses, so that the later tests'
// rank 0 starts from nothing.
constexpr int kRank = harness::MemoryTracker::kMaxRanks - 1;

using Kind = Op::Kind;

// Every schedule of rotor's form for the sub-problem P(i, l) of solvers.cpp (x[i] held, end
// holding d[i]): the chain move (Fe_i, P(i+1, l), B_i) and every leaf move j (CF_i, Fn_{i+1}
// .. Fn_{j-1}, P(j, l), P(i, j-1)), whatever memory they take. 22, 90 and 394 schedules for
// chains of 3, 4 and 5 stages.
std::vector<std::vector<Op>> persistentSchedules(int i, int l, int L) {
  if (i == L) return {{{Kind::kLoss, 0}}};
  if (i == l) return {{{Kind::kForwardEnable, i}, {Kind::kBackward, i}}};
  std::vector<std::vector<Op>> out;
  for (auto& rest : persistentSchedules(i + 1, l, L)) {
    std::vector<Op> ops = {{Kind::kForwardEnable, i}};
    ops.insert(ops.end(), rest.begin(), rest.end());
    ops.push_back({Kind::kBackward, i});
    out.push_back(std::move(ops));
  }
  for (int j = i + 1; j <= l; ++j) {
    std::vector<Op> advance;
    for (int k = i; k < j; ++k)
      advance.push_back({k == i ? Kind::kForwardCheck : Kind::kForwardNoGrad, k});
    const auto after = persistentSchedules(j, l, L);
    const auto before = persistentSchedules(i, j - 1, L);
    for (const auto& a : after) {
      for (const auto& b : before) {
        std::vector<Op> ops = advance;
        ops.insert(ops.end(), a.begin(), a.end());
        ops.insert(ops.end(), b.begin(), b.end());
        out.push_back(std::move(ops));
      }
    }
  }
  return out;
}

// Every sequence of rotor's operations from "x[0] held" to "d[0] produced, loss done, nothing
// else held", by chain.h's rules for what each operation reads, writes and frees, computing no
// value a copy of which is held: not only rotor's form (only for the shortest chains).
std::vector<std::vector<Op>> everySchedule(int L) {
  struct State {
    std::vector<bool> x, xbar, d;
    bool loss = false;
  };
  std::vector<std::vector<Op>> out;
  std::vector<Op> ops;
  const auto haveX = [](const State& s, int i) { return s.x[i] || (i > 0 && s.xbar[i]); };
  std::function<void(const State&)> walk = [&](const State& s) {
    bool done = s.loss && s.d[0];
    for (int i = 0; i <= L && done; ++i) done = !s.x[i] && !s.xbar[i] && (i == 0 || !s.d[i]);
    if (done) {
      out.push_back(ops);
      return;
    }
    const auto step = [&](Op op, const State& next) {
      ops.push_back(op);
      walk(next);
      ops.pop_back();
    };
    for (int i = 0; i < L; ++i) {
      if (!haveX(s, i)) continue;
      // A value is never computed while a copy of it is held (x[i+1] beside its tape, a tape
      // beside its x[i+1]): no solver emits such a schedule, and the model counts the two
      // copies as one where the executor holds both (measured: of the 109 sequences of 2
      // stages, the 19 whose peak the model missed, by 1 KiB, all do it; the 9 left are exact).
      if (!haveX(s, i + 1)) {
        State cf = s;
        cf.x[i + 1] = true;
        step({Kind::kForwardCheck, i}, cf);
        State fn = cf;
        fn.x[i] = false;
        step({Kind::kForwardNoGrad, i}, fn);
      }
      if (!s.xbar[i + 1] && !s.x[i + 1]) {
        State fe = s;
        fe.xbar[i + 1] = true;
        step({Kind::kForwardEnable, i}, fe);
      }
      if (s.d[i + 1] && s.xbar[i + 1] && haveX(s, i)) {
        State b = s;
        b.d[i + 1] = b.xbar[i + 1] = b.x[i] = false;
        b.d[i] = true;
        step({Kind::kBackward, i}, b);
      }
    }
    if (!s.loss && haveX(s, L)) {
      State l = s;
      l.x[L] = false;
      l.d[L] = l.loss = true;
      step({Kind::kLoss, 0}, l);
    }
  };
  State start{std::vector<bool>(L + 1), std::vector<bool>(L + 1), std::vector<bool>(L + 1)};
  start.x[0] = true;
  walk(start);
  return out;
}

std::string names(const std::vector<Op>& ops) {
  std::string s;
  for (const Op& op : ops) s += (s.empty() ? "" : " ") + op.name();
  return s;
}

// A small chain workload, profiled, with every schedule of it run once.
struct ExecutedChain {
  std::string workload;
  std::unique_ptr<reference::ChainNet> net;
  Chain chain;  // profiled sizes, unit forward times, zero backward times
  std::map<std::string, std::pair<std::vector<Op>, ExecutedSchedule>> runs;  // by names(ops)

  const ExecutedSchedule& run(const std::vector<Op>& ops) {
    auto it = runs.find(names(ops));
    if (it == runs.end()) {
      it = runs.emplace(names(ops),
                        std::make_pair(ops, executeSchedule(*net, ops, chain.x[0], kRank)))
               .first;
    }
    return it->second.second;
  }
};

ExecutedChain& executedChain(const std::string& workload, const nlohmann::json& shape,
                             bool everySequence) {
  static std::map<std::string, std::unique_ptr<ExecutedChain>> cache;
  const std::string key = workload + shape.dump();
  auto& slot = cache[key];
  if (slot) return *slot;
  harness::MemoryTracker::instance().install();
  const harness::ScopedMemoryRank scope(kRank);
  slot = std::make_unique<ExecutedChain>();
  slot->workload = workload + " " + shape.dump();
  slot->net = reference::findChainWorkload(workload)->makeNet(shape, at::kFloat, 5);
  Chain c = profileChain(*slot->net, kRank, 1);
  std::fill(c.ftime.begin(), c.ftime.end(), 1.0);
  std::fill(c.btime.begin(), c.btime.end(), 0.0);
  slot->chain = c;
  const int L = c.length();
  for (const auto& ops : everySequence ? everySchedule(L) : persistentSchedules(0, L, L)) {
    if (simulate(c, ops).valid) slot->run(ops);
  }
  return *slot;
}

// What a solver must do at a budget, judged by execution: return a schedule where an executed
// schedule fits (rotor, which claims the optimum), run it within the budget, peak and count its
// forwards as it predicted, and (rotor) run no more forwards than any executed schedule within
// the budget. The budgets are every peak an executed schedule measured. One line per problem,
// naming the solver.
std::vector<std::string> solverMismatches(ExecutedChain& ec,
                                          const std::vector<std::string>& solvers,
                                          const std::set<std::string>& optimal) {
  std::set<double> budgets;
  for (const auto& [key, r] : ec.runs) budgets.insert(r.second.peak);
  std::vector<std::string> out;
  for (double budget : budgets) {
    const std::pair<std::vector<Op>, ExecutedSchedule>* best = nullptr;
    for (const auto& [key, r] : ec.runs) {
      if (r.second.peak <= budget &&
          (!best || r.second.totalForwards() < best->second.totalForwards())) {
        best = &r;
      }
    }
    const std::string at = ec.workload + " budget " + std::to_string(static_cast<int64_t>(budget));
    for (const auto& solver : solvers) {
      // A slot per byte: rotor's program is exact (solvers.cpp), so only its model can err.
      const auto s = solve(solver, ec.chain, {budget, static_cast<int>(budget) + 1});
      if (!s) {
        if (optimal.count(solver)) {
          out.push_back(solver + ", " + at + ": no schedule, but " + names(best->first) + " ran " +
                        std::to_string(best->second.totalForwards()) + " forwards peaking at " +
                        std::to_string(static_cast<int64_t>(best->second.peak)));
        }
        continue;
      }
      const ExecutedSchedule& e = ec.run(s->ops);
      const std::string what = solver + ", " + at + ": " + names(s->ops);
      if (e.peak > budget) {
        out.push_back(what + " peaked at " + std::to_string(static_cast<int64_t>(e.peak)) +
                      ", over the budget");
      }
      if (e.peak != s->predictedPeak) {
        out.push_back(what + " peaked at " + std::to_string(static_cast<int64_t>(e.peak)) +
                      ", predicted " + std::to_string(static_cast<int64_t>(s->predictedPeak)));
      }
      if (e.totalForwards() != s->predictedTime) {
        out.push_back(what + " ran " + std::to_string(e.totalForwards()) + " forwards, predicted " +
                      std::to_string(s->predictedTime));
      }
      if (optimal.count(solver) && e.totalForwards() > best->second.totalForwards()) {
        out.push_back(what + " ran " + std::to_string(e.totalForwards()) + " forwards; " +
                      names(best->first) + " ran " + std::to_string(best->second.totalForwards()) +
                      " within the budget");
      }
    }
  }
  return out;
}

std::string describe(const std::vector<std::string>& ms, size_t limit = 8) {
  std::string s;
  for (size_t i = 0; i < ms.size() && i < limit; ++i) s += "\n  " + ms[i];
  if (ms.size() > limit) s += "\n  ... " + std::to_string(ms.size() - limit) + " more";
  return s;
}

struct SmallChain {
  const char* workload;
  nlohmann::json shape;
  bool everySequence;  // every sequence of operations, not only rotor's form
};

std::vector<SmallChain> smallChains() {
  return {
      {"mlp_chain", {{"batch", 8}, {"width", 32}, {"depth", 2}, {"dropout", 0.2}}, true},
      {"mlp_chain", {{"batch", 8}, {"width", 32}, {"depth", 3}, {"dropout", 0.2}}, false},
      {"mlp_chain", {{"batch", 4}, {"width", 16}, {"depth", 5}, {"dropout", 0.2}}, false},
      {"gpt2_stack",
       {{"batch", 2}, {"seq", 8}, {"d_model", 16}, {"heads", 2}, {"layers", 3}, {"dropout", 0.2}},
       false},
  };
}

TEST(SolverExecution, EveryScheduleOfASmallChainRunsAsTheModelSays) {
  for (const auto& sc : smallChains()) {
    ExecutedChain& ec = executedChain(sc.workload, sc.shape, sc.everySequence);
    ASSERT_GT(ec.runs.size(), sc.everySequence ? 5u : 10u) << ec.workload;
    int off = 0;
    std::string first;
    for (const auto& [key, r] : ec.runs) {
      const Simulation sim = simulate(ec.chain, r.first);
      const bool same = sim.peak == r.second.peak && sim.time == r.second.totalForwards();
      if (!same && off++ == 0) {
        first = key + ": measured peak " + std::to_string(static_cast<int64_t>(r.second.peak)) +
                " and " + std::to_string(r.second.totalForwards()) + " forwards, model " +
                std::to_string(static_cast<int64_t>(sim.peak)) + " and " + std::to_string(sim.time);
      }
    }
    EXPECT_EQ(off, 0) << ec.workload << ": " << off << " of " << ec.runs.size()
                      << " schedules ran away from the model; first " << first;
  }
}

TEST(SolverExecution, EverySolversScheduleRunsWithinItsBudgetAsPredicted) {
  for (const auto& sc : smallChains()) {
    ExecutedChain& ec = executedChain(sc.workload, sc.shape, sc.everySequence);
    const auto ms = solverMismatches(ec, solverNames(), {});
    EXPECT_TRUE(ms.empty()) << ms.size() << " problems:" << describe(ms);
  }
}

// rotor claims the optimum: at every budget, no schedule that ran within it ran fewer forwards.
TEST(SolverExecution, RotorRunsNoMoreForwardsThanAnyScheduleThatRanWithinTheBudget) {
  for (const auto& sc : smallChains()) {
    ExecutedChain& ec = executedChain(sc.workload, sc.shape, sc.everySequence);
    const auto ms = solverMismatches(ec, {"rotor"}, {"rotor"});
    EXPECT_TRUE(ms.empty()) << ms.size() << " problems:" << describe(ms);
  }
}

// Planted fault: rotor's table counts each stage's tape without the output it holds. Its
// schedules stay valid (the simulator prices them), so only execution against every other
// schedule shows what rotor then misses. On the GPT-2 chain, where the true table passes, it
// finds no schedule at budgets where one ran.
TEST(SolverExecution, ARotorTableThatCountsATapeWithoutItsOutputIsReported) {
  const auto sc = smallChains().back();
  ExecutedChain& ec = executedChain(sc.workload, sc.shape, sc.everySequence);
  ASSERT_TRUE(solverMismatches(ec, {"rotor"}, {"rotor"}).empty()) << "the true table fails here";
  const ScopedRotorFault fault(RotorFault::kTapeWithoutItsOutput);
  const auto ms = solverMismatches(ec, {"rotor"}, {"rotor"});
  ASSERT_FALSE(ms.empty()) << "rotor's table with a tape counted too small went unnoticed";
  for (const auto& m : ms) EXPECT_EQ(m.rfind("rotor, ", 0), 0u) << m;
}

}  // namespace
}  // namespace sb::strategies::checkpointing
