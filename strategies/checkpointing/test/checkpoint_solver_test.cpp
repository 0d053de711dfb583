#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <queue>
#include <random>

#include "strategies/checkpointing/solvers.h"
#include "strategies/checkpointing/solvers_testing.h"

namespace sb::strategies::checkpointing {
namespace {

std::vector<Op> ops(const std::vector<std::string>& names) {
  std::vector<Op> out;
  for (const auto& n : names) out.push_back(Op::parse(n));
  return out;
}

// Two stages of unit time, inputs of size 1, tapes of size 2, no temporaries.
Chain twoStages() {
  Chain c;
  c.ftime = {1, 1};
  c.btime = {1, 1, 1};
  c.x = {1, 1, 1};
  c.xbar = {1, 2, 2};
  c.ftmp = {0, 0};
  c.btmp = {0, 0, 0};
  return c;
}

TEST(ChainSimulation, KeepingEveryTapeCostsWhatWasWorkedOutByHand) {
  // x0 = 1; Fe_0 holds xbar1 (2): 3; Fe_1 holds xbar2 (2): 5; L needs d2 (1): 6; B_1 writes
  // d1 (1) while d2, xbar2 are held: 7, then frees d2 and xbar2: 4; B_0 writes d0: 5; frees
  // d1, xbar1, x0. Peak 7; time: 2 forwards + 3 backwards = 5.
  const auto s = simulate(twoStages(), ops({"Fe_0", "Fe_1", "L", "B_1", "B_0"}));
  ASSERT_TRUE(s.valid) << s.problem;
  EXPECT_EQ(s.peak, 7);
  EXPECT_EQ(s.time, 5);
  EXPECT_EQ(s.recomputedForwards, 0);
}

TEST(ChainSimulation, CheckpointingTheMiddleInputCostsWhatWasWorkedOutByHand) {
  // CF_0: x0 + x1 = 2; Fe_1: 4; L: 5 (+ d2); B_1: 6 at its peak, then x0 + d1 = 2; Fe_0:
  // 4; B_0: 5. Peak 6, time 3 forwards + 3 backwards = 6, one forward recomputed.
  const auto s = simulate(twoStages(), ops({"CF_0", "Fe_1", "L", "B_1", "Fe_0", "B_0"}));
  ASSERT_TRUE(s.valid) << s.problem;
  EXPECT_EQ(s.peak, 6);
  EXPECT_EQ(s.time, 6);
  EXPECT_EQ(s.recomputedForwards, 1);
}

// The step's own terms (chain.h: output_kept, loss_bytes, loss_grad_kept), worked by hand on
// the same chain with a loss of 1: Fe_0 3, Fe_1 5; L peaks at 6 (x2 read, d2 written), keeps
// the loss (1) and d2 (1): 7; B_1 peaks at 8 (d1 written), frees xbar2 but keeps x2's bytes as
// the output (1) and d2 (the engine's): 7; B_0 peaks at 8 and ends holding d0, d2, the output
// and the loss: 4. rotor's model alone peaks at 7; the terms add at most x2 + 1 + x2 = 3.
TEST(ChainSimulation, TheStepsOwnTermsCostWhatWasWorkedOutByHand) {
  Chain c = twoStages();
  c.outputKept = true;
  c.lossBytes = 1;
  c.lossGradKept = true;
  const auto s = simulate(c, ops({"Fe_0", "Fe_1", "L", "B_1", "B_0"}));
  ASSERT_TRUE(s.valid) << s.problem;
  EXPECT_EQ(s.peak, 8);
  EXPECT_EQ(c.stepTermsBound(), 3);
  // A backward that ran already cannot run again, though d2 is still held.
  const auto twice = simulate(c, ops({"Fe_0", "Fe_1", "L", "B_1", "Fe_1", "B_1", "B_0"}));
  EXPECT_FALSE(twice.valid);
  EXPECT_NE(twice.problem.find("the backward of stage 1 already ran"), std::string::npos)
      << twice.problem;
}

// Taped and untaped forwards priced apart (fetmp): an untaped forward whose temporaries dwarf
// the budget rules out recomputation, and rotor keeps every tape instead (the fuzz target's
// first finding: those sizes once overflowed rotor's slot count).
TEST(ChainSimulation, TapedAndUntapedForwardsHaveTheirOwnTemporaries) {
  Chain c = twoStages();
  c.ftmp = {1e80, 1e80};
  c.fetmp = {0, 0};
  EXPECT_EQ(simulate(c, ops({"Fe_0", "Fe_1", "L", "B_1", "B_0"})).peak, 7);
  EXPECT_EQ(simulate(c, ops({"CF_0", "Fe_1", "L", "B_1", "Fe_0", "B_0"})).peak, 1e80 + 2);
  SolveOptions o;
  o.budget = 7;
  o.slots = 50;
  const auto s = solve("rotor", c, o);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->names(), (std::vector<std::string>{"Fe_0", "Fe_1", "L", "B_1", "B_0"}));
  EXPECT_EQ(s->predictedPeak, 7);
}

TEST(ChainSimulation, InvalidSchedulesNameTheFirstOperationThatCannotRun) {
  const Chain c = twoStages();
  auto s = simulate(c, ops({"Fn_0", "Fe_1", "L", "B_1", "Fe_0", "B_0"}));
  EXPECT_FALSE(s.valid);
  EXPECT_NE(s.problem.find("operation 4 (Fe_0): its input x[0] is not held"), std::string::npos)
      << s.problem;
  s = simulate(c, ops({"Fe_0", "Fe_1", "B_1"}));
  EXPECT_NE(s.problem.find("d[2] is not held"), std::string::npos) << s.problem;
  s = simulate(c, ops({"Fe_0", "Fe_1", "L", "B_1"}));
  EXPECT_NE(s.problem.find("ends before"), std::string::npos) << s.problem;
  s = simulate(c, ops({"Fe_0", "Fe_1", "L", "B_1", "CF_0", "B_0"}));  // a useless x1
  EXPECT_NE(s.problem.find("still held: x1"), std::string::npos) << s.problem;
}

// ---- an independent brute force over every sequence of operations ---------------------------
//
// Dijkstra over the states of the memory model (which values are held), each operation an
// edge whose cost is its time, allowed only when its peak fits the budget. It knows nothing of
// segments or recursion, so it finds the optimum over all schedules, not only rotor's.
struct BruteForce {
  const Chain& c;
  int L;
  explicit BruteForce(const Chain& chain) : c(chain), L(chain.length()) {}
  // Bits: x[0..L], xbar[1..L] at L+1+i-1, d[0..L] at 2L+1+i, and "loss done" at 3L+2.
  int xb(int i) const { return i; }
  int xbarb(int i) const { return L + i; }
  int db(int i) const { return 2 * L + 1 + i; }
  int lossb() const { return 3 * L + 2; }
  double mem(uint64_t s) const {
    double m = 0;
    for (int i = 0; i <= L; ++i) {
      if (s >> xb(i) & 1) m += c.x[i];
      if (i > 0 && (s >> xbarb(i) & 1)) m += c.xbar[i];
      if (s >> db(i) & 1) m += c.x[i];
    }
    return m;
  }
  bool haveX(uint64_t s, int i) const { return (s >> xb(i) & 1) || (i > 0 && (s >> xbarb(i) & 1)); }

  // The least time of any valid schedule under `budget`; +inf if none fits.
  double optimum(double budget) const {
    const auto bit = [](int b) { return uint64_t{1} << b; };
    const uint64_t start = bit(xb(0));
    const uint64_t goal = bit(db(0)) | bit(lossb());
    std::map<uint64_t, double> dist;
    using Item = std::pair<double, uint64_t>;
    std::priority_queue<Item, std::vector<Item>, std::greater<>> pq;
    if (mem(start) > budget) return INFINITY;
    dist[start] = 0;
    pq.push({0, start});
    while (!pq.empty()) {
      auto [t, s] = pq.top();
      pq.pop();
      if (t > dist[s]) continue;
      if (s == goal) return t;
      const double cur = mem(s);
      const auto relax = [&](uint64_t next, double peak, double dt) {
        if (peak > budget) return;
        auto it = dist.find(next);
        if (it == dist.end() || t + dt < it->second) {
          dist[next] = t + dt;
          pq.push({t + dt, next});
        }
      };
      for (int i = 0; i < L; ++i) {
        if (!haveX(s, i)) continue;
        if (!(s >> xb(i + 1) & 1)) {
          const double peak = cur + c.x[i + 1] + c.ftmp[i];
          relax(s | bit(xb(i + 1)), peak, c.ftime[i]);                  // CF_i
          relax((s & ~bit(xb(i))) | bit(xb(i + 1)), peak, c.ftime[i]);  // Fn_i
        }
        if (!(s >> xbarb(i + 1) & 1)) {
          relax(s | bit(xbarb(i + 1)), cur + c.xbar[i + 1] + c.ftmp[i], c.ftime[i]);  // Fe_i
        }
        if ((s >> db(i + 1) & 1) && (s >> xbarb(i + 1) & 1) && haveX(s, i)) {  // B_i
          uint64_t n = s & ~bit(db(i + 1)) & ~bit(xbarb(i + 1)) & ~bit(xb(i));
          relax(n | bit(db(i)), cur + c.x[i] + c.btmp[i], c.btime[i]);
        }
      }
      if (!(s >> lossb() & 1) && haveX(s, L)) {  // the loss
        relax((s & ~bit(xb(L))) | bit(db(L)) | bit(lossb()), cur + c.x[L] + c.btmp[L], c.btime[L]);
      }
    }
    return INFINITY;
  }
};

Chain randomChain(std::mt19937& rng, int L) {
  std::uniform_int_distribution<int> time(1, 6), size(1, 4), tmp(0, 2);
  Chain c;
  for (int i = 0; i < L; ++i) {
    c.ftime.push_back(time(rng));
    c.ftmp.push_back(tmp(rng));
  }
  for (int i = 0; i <= L; ++i) {
    c.btime.push_back(time(rng));
    c.btmp.push_back(tmp(rng));
    c.x.push_back(size(rng));
    c.xbar.push_back(c.x.back() + (i ? size(rng) - 1 : 0));
  }
  return c;
}

double nonePeak(const Chain& c) { return simulate(c, segmentSchedule(c.length(), {0})).peak; }

TEST(RotorSolver, MatchesABruteForceOverAllSchedulesOnSmallChains) {
  std::mt19937 rng(20261121);
  int compared = 0, infeasible = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const Chain c = randomChain(rng, 2 + trial % 3);  // 2 to 4 stages
    const BruteForce bf(c);
    for (double budget = c.x[0]; budget <= nonePeak(c) + 1; budget += 1) {
      // Integer sizes and a budget under the slot count: rotor's memory model is exact.
      const auto s = solve("rotor", c, {budget, 500});
      const double best = bf.optimum(budget);
      if (std::isinf(best)) {
        EXPECT_FALSE(s.has_value()) << "rotor found a schedule the brute force did not, budget "
                                    << budget << " chain " << c.toJson().dump();
        ++infeasible;
        continue;
      }
      ASSERT_TRUE(s.has_value()) << "budget " << budget << " fits a schedule of time " << best
                                 << " but rotor found none; chain " << c.toJson().dump();
      EXPECT_EQ(s->predictedTime, best) << "budget " << budget << " chain " << c.toJson().dump();
      EXPECT_LE(s->predictedPeak, budget);
      EXPECT_EQ(s->tableTime, s->predictedTime);
      ++compared;
    }
  }
  EXPECT_GT(compared, 100);
  EXPECT_GT(infeasible, 10);  // the sweep starts below every chain's smallest feasible budget
}

TEST(RotorSolver, IsNeverWorseThanAnyOtherSolverThatFits) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 30; ++trial) {
    const Chain c = randomChain(rng, 3 + trial % 8);
    const double top = nonePeak(c);
    for (double frac : {0.3, 0.45, 0.6, 0.75, 0.9, 1.0}) {
      const double budget = std::ceil(frac * top);
      const auto r = solve("rotor", c, {budget, 500});
      for (const auto& other : solverNames()) {
        const auto s = solve(other, c, {budget, 500});
        if (!s) continue;
        EXPECT_LE(s->predictedPeak, budget) << other;
        ASSERT_TRUE(r.has_value()) << other << " fits budget " << budget << " but rotor does not";
        EXPECT_LE(r->predictedTime, s->predictedTime) << other << " budget " << budget;
      }
    }
  }
}

TEST(RotorSolver, WithFewSlotsStaysWithinTheBudget) {
  // Real byte sizes and 50 slots: rounding up can only cost time, never the budget.
  std::mt19937 rng(3);
  for (int trial = 0; trial < 20; ++trial) {
    Chain c = randomChain(rng, 6);
    for (auto* v : {&c.x, &c.xbar, &c.ftmp, &c.btmp}) {
      for (double& s : *v) s = s * 1000003.7;
    }
    for (double frac : {0.4, 0.6, 0.8, 1.0}) {
      const double budget = frac * nonePeak(c);
      if (auto s = solve("rotor", c, {budget, 50})) {
        EXPECT_LE(s->predictedPeak, budget);
      }
    }
  }
}

TEST(Solvers, NoneAndFullAreTheTwoExtremes) {
  const Chain c = twoStages();
  const auto none = solve("none", c, {0, 500});
  const auto full = solve("full", c, {0, 500});
  ASSERT_TRUE(none && full);
  EXPECT_EQ(none->names(), (std::vector<std::string>{"Fe_0", "Fe_1", "L", "B_1", "B_0"}));
  EXPECT_EQ(full->names(), (std::vector<std::string>{"CF_0", "Fe_1", "L", "B_1", "Fe_0", "B_0"}));
  EXPECT_EQ(none->predictedPeak, 7);
  EXPECT_EQ(full->predictedPeak, 6);
  EXPECT_FALSE(solve("none", c, {6.5, 500}).has_value());
  // Budget 6: keeping every tape does not fit, the one recomputation does; rotor finds it.
  const auto r = solve("rotor", c, {6, 500});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->predictedTime, 6);
  EXPECT_FALSE(solve("rotor", c, {4, 500}).has_value());
}

// L stages of unit time, inputs of size 1, tapes of size `tape`, no temporaries.
Chain uniform(int L, double tape) {
  Chain c;
  c.ftime.assign(L, 1);
  c.ftmp.assign(L, 0);
  c.btime.assign(L + 1, 1);
  c.btmp.assign(L + 1, 0);
  c.x.assign(L + 1, 1);
  c.xbar.assign(L + 1, tape);
  return c;
}

TEST(Solvers, SqrtCutsAChainOfSixteenIntoFourSegments) {
  const Chain c = uniform(16, 3);
  const auto s = solve("sqrt", c, {0, 500});
  ASSERT_TRUE(s.has_value());
  // Segments [0,4) [4,8) [8,12) [12,16): the first three are recomputed, 12 forwards.
  EXPECT_EQ(s->recomputedForwards, 12);
  int checks = 0;
  for (const auto& op : s->ops) checks += op.kind == Op::Kind::kForwardCheck;
  EXPECT_EQ(checks, 3);
}

// Griewank's closed form: with s snapshots besides the input (s + 1 in his count) and n steps,
// reversal needs t = r n - C(s + 1 + r, r - 1) forward steps, r the least with C(s + 1 + r, r)
// >= n.
long binomial(long n, long k) {
  if (k < 0 || k > n) return 0;
  long b = 1;
  for (long i = 1; i <= k; ++i) b = b * (n - k + i) / i;
  return b;
}

TEST(Revolve, TheTableMatchesGriewanksBinomialCount) {
  for (int s = 0; s <= 5; ++s) {
    for (int n = 1; n <= 40; ++n) {
      const long sg = s + 1;
      long r = 0;
      while (binomial(sg + r, sg) < n) ++r;
      const long closed = r * n - binomial(sg + r, r - 1);
      EXPECT_EQ(revolveForwardSteps(n, s), closed) << "n=" << n << " s=" << s;
    }
  }
}

TEST(Revolve, ItsSchedulesAreValidAndCountTheirAdvances) {
  const int L = 9;
  const Chain c = uniform(L, 2);
  for (int s = 0; s <= 4; ++s) {
    const auto sim = simulate(c, revolveSchedule(L, s));
    ASSERT_TRUE(sim.valid) << sim.problem;
    // Every stage runs taped once; the rest are the advances of the table.
    EXPECT_EQ(sim.recomputedForwards, revolveForwardSteps(L + 1, s)) << s;
  }
}

TEST(ChainJson, MalformedChainsNameTheKeyAndIndex) {
  const auto err = [](const std::string& text) {
    try {
      Chain::fromJson(nlohmann::json::parse(text), "c.json");
    } catch (const ChainError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string ok =
      R"({"ftime":[1,1],"btime":[1,1,1],"x":[1,1,1],"xbar":[1,2,2],"ftmp":[0,0],"btmp":[0,0,0]})";
  EXPECT_EQ(err(ok), "no error");
  EXPECT_NE(err(R"({"ftime":[1]})").find("c.json: missing key 'btime'"), std::string::npos);
  std::string bad = ok;
  bad.replace(bad.find("\"btime\":[1,1,1]"), 15, "\"btime\":[1,1]");
  EXPECT_NE(err(bad).find("key 'btime' must have L+1 = 3 values"), std::string::npos) << err(bad);
  bad = ok;
  bad.replace(bad.find("\"x\":[1,1,1]"), 11, "\"x\":[1,\"a\",1]");
  EXPECT_NE(err(bad).find("key 'x'[1]: expected a number"), std::string::npos) << err(bad);
  bad = ok;
  bad.replace(bad.find("\"ftmp\":[0,0]"), 12, "\"ftmp\":[0,-1]");
  EXPECT_NE(err(bad).find("key 'ftmp'[1]: expected a non-negative number"), std::string::npos);
  EXPECT_NE(err(R"([1,2])").find("expected a JSON object"), std::string::npos);
  bad = ok;
  bad.insert(1, "\"xbarr\":[],");
  EXPECT_NE(err(bad).find("unknown key 'xbarr'"), std::string::npos) << err(bad);
  // The optional terms: checked as strictly, and kept by the round trip.
  bad = ok;
  bad.insert(1, "\"output_kept\":1,");
  EXPECT_NE(err(bad).find("key 'output_kept': expected true or false"), std::string::npos)
      << err(bad);
  bad = ok;
  bad.insert(1, "\"loss_bytes\":8,");
  EXPECT_NE(err(bad).find("key 'loss_bytes': only with \"output_kept\": true"), std::string::npos)
      << err(bad);
  bad = ok;
  bad.insert(1, "\"output_kept\":true,\"loss_bytes\":-1,");
  EXPECT_NE(err(bad).find("key 'loss_bytes': expected a non-negative number"), std::string::npos)
      << err(bad);
  bad = ok;
  bad.insert(1, "\"fetmp\":[0],");
  EXPECT_NE(err(bad).find("key 'fetmp' must have L = 2 values"), std::string::npos) << err(bad);
  std::string full = ok;
  full.insert(1, R"("fetmp":[0,1],"output_kept":true,"loss_bytes":8,"loss_grad_kept":true,)");
  const Chain c = Chain::fromJson(nlohmann::json::parse(full), "c.json");
  EXPECT_EQ(Chain::fromJson(c.toJson(), "again").toJson(), c.toJson());
  EXPECT_TRUE(c.outputKept && c.lossGradKept);
  EXPECT_EQ(c.lossBytes, 8);
  EXPECT_EQ(c.taped(1), 1);
}

}  // namespace
// The fast rotor is the reference table's program laid out for speed: the same schedule (so
// the same time and peak) on every chain, budget and slot count tried, integral and not, with
// the step's terms and without. With them, the fast one's second table (the chain without its
// terms) shares all rows but 2L + 1 with the first, where the reference builds both whole.
TEST(RotorSolver, TheFastTableMakesTheReferenceTablesSchedules) {
  std::mt19937 rng(2026);
  int secondWon = 0;
  for (int trial = 0; trial < 90; ++trial) {
    Chain c = randomChain(rng, 2 + trial % 25);
    if (trial % 3 == 0) {  // sizes that are not whole slots
      for (auto* v : {&c.x, &c.xbar, &c.ftmp, &c.btmp}) {
        for (double& s : *v) s = s * 1000.37;
      }
    }
    if (trial % 3 != 1) {  // a profiled chain's terms: output and loss kept, d[L] held
      std::uniform_int_distribution<int> tmp(0, 2), flag(0, 1);
      c.outputKept = flag(rng) || trial % 2;
      c.lossBytes = c.outputKept ? (trial % 3 == 0 ? 8.5 : 8) : 0;
      c.lossGradKept = flag(rng) || !c.outputKept;
      c.fetmp.clear();
      for (int i = 0; i < c.length(); ++i) c.fetmp.push_back(c.ftmp[i] + tmp(rng));
    }
    for (double frac : {0.25, 0.4, 0.6, 0.8, 1.0, 0.0}) {
      for (int slots : {7, 60, 500}) {
        const SolveOptions o{frac * nonePeak(c), slots};
        const auto fast = solve("rotor", c, o);
        const auto ref = solveRotorReference(c, o);
        ASSERT_EQ(fast.has_value(), ref.has_value()) << c.toJson().dump() << " budget " << o.budget;
        if (!fast) continue;
        EXPECT_EQ(fast->names(), ref->names()) << c.toJson().dump() << " budget " << o.budget;
        EXPECT_EQ(fast->predictedTime, ref->predictedTime);
        EXPECT_EQ(fast->tableTime, ref->tableTime);
        // Where the table without the terms made the schedule, the shared rows were read.
        if (c.stepTermsBound() > 0) {
          const ScopedRotorFault firstOnly(RotorFault::kWithoutThePlainTable);
          const auto first = solve("rotor", c, o);
          if (!first || first->predictedTime > fast->predictedTime) ++secondWon;
        }
      }
    }
  }
  EXPECT_GT(secondWon, 0) << "no case where the table without the step's terms was compared";
}

// A table over the memory allowed is refused before anything is allocated, naming its size.
TEST(RotorSolver, ATableOverTheMemoryAllowedIsRefused) {
  std::mt19937 rng(7);
  const Chain c = randomChain(rng, 2000);
  SolveOptions o{nonePeak(c) / 2, 500};
  o.maxSolverBytes = 1e9;
  try {
    solve("rotor", c, o);
    FAIL() << "a 2,000-stage table at 500 slots fit in 1 GB";
  } catch (const SolverLimitError& e) {
    // (2001 x 2002 / 2) sub-chains x ((501 slots + the row's least) x 8 bytes + 4).
    EXPECT_NEAR(e.neededBytes(), 2001.0 * 2002 / 2 * (502 * 8 + 4), 1.0);
    EXPECT_NE(std::string(e.what()).find("--max-solver-memory"), std::string::npos) << e.what();
  }
}

}  // namespace sb::strategies::checkpointing
