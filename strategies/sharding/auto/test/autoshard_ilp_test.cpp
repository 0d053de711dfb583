#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>

#include "strategies/sharding/auto/ilp.h"

namespace sb::strategies::autoshard {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// Costs are sums of a few dozen doubles below 100: CBC's objective and the brute force's agree
// to rounding, far inside this; a wrong choice differs by much more (costs are drawn from a
// continuous distribution).
constexpr double kObjectiveTolerance = 1e-6;

bool near(double a, double b) {
  return std::abs(a - b) <= kObjectiveTolerance * std::max(1.0, std::abs(b));
}

using Matrix = std::vector<std::vector<double>>;

// A chain A -> B -> C, each replicated (R) or sharded (S):
//   var costs   A: R 10, S 4    B: R 9, S 5    C: R 8, S 2
//   A -> B      RR 0, RS 1, SR 8, SS 0
//   B -> C      RR 0, RS 1, SR 6, SS 13
//   bytes       A: R 4, S 1     B: R 3, S 1    C: R 5, S 1   (one memory row)
// Every choice, var costs + edge costs = total (peak bytes):
//   RRR 27 + 0 + 0  = 27 (12)     SRR 21 + 8 + 0  = 29 (9)
//   RRS 21 + 0 + 1  = 22 (8)      SRS 15 + 8 + 1  = 24 (5)
//   RSR 23 + 1 + 6  = 30 (10)     SSR 17 + 0 + 6  = 23 (7)
//   RSS 17 + 1 + 13 = 31 (6)      SSS 11 + 0 + 13 = 24 (3)
// Greedy per node takes SSS (24); the optimum is RRS (22), paying more on A and B so that
// nothing is gathered back. Within 7 bytes it is SSR (23); the smallest peak is SSS's 3.
SelectionProblem chain() {
  SelectionProblem p;
  p.vars = {{"A", {10, 4}, {"R", "S"}}, {"B", {9, 5}, {"R", "S"}}, {"C", {8, 2}, {"R", "S"}}};
  p.edges = {{0, 1, {{0, 1}, {8, 0}}}, {1, 2, {{0, 1}, {6, 13}}}};
  p.memory = {{"peak", 0, {{0, {4, 1}}, {1, {3, 1}}, {2, {5, 1}}}}};
  return p;
}

constexpr int kR = 0, kS = 1;

TEST(SelectionChain, EdgeCostsMakeTheOptimumDifferFromTheCheapestChoicePerNode) {
  const SelectionProblem p = chain();
  const Selection s = solveIlp(p);
  EXPECT_EQ(s.status, "optimal");
  EXPECT_EQ(s.choice, (std::vector<int>{kR, kR, kS}));
  EXPECT_DOUBLE_EQ(s.objective, 22);
  EXPECT_DOUBLE_EQ(s.peakMemory, 8);
  EXPECT_DOUBLE_EQ(s.gap, 0);
  EXPECT_DOUBLE_EQ(evaluate(p, {kS, kS, kS}), 24);  // what taking each node's cheapest gives
}

TEST(SelectionChain, AMemoryLimitBelowTheOptimumsPeakMovesToTheBestThatFits) {
  SelectionProblem p = chain();
  p.memoryLimit = 7;
  const Selection s = solveIlp(p);
  EXPECT_EQ(s.status, "optimal");
  EXPECT_EQ(s.choice, (std::vector<int>{kS, kS, kR}));
  EXPECT_DOUBLE_EQ(s.objective, 23);
  EXPECT_DOUBLE_EQ(s.peakMemory, 7);
  p.memoryLimit = 8;  // the optimum's peak exactly: it fits
  EXPECT_EQ(solveIlp(p).choice, (std::vector<int>{kR, kR, kS}));
}

TEST(SelectionChain, ALimitBelowTheSmallestPeakIsInfeasible) {
  SelectionProblem p = chain();
  p.memoryLimit = 2;
  const Selection s = solveIlp(p);
  EXPECT_EQ(s.status, "infeasible");
  EXPECT_TRUE(s.choice.empty());
  EXPECT_EQ(solveBruteForce(p).status, "infeasible");
}

TEST(SelectionChain, TheSmallestPeakIgnoresTimeAndTheLimit) {
  SelectionProblem p = chain();
  p.memoryLimit = 2;
  const Selection s = solveMinPeakMemory(p);
  EXPECT_EQ(s.status, "optimal");
  EXPECT_EQ(s.choice, (std::vector<int>{kS, kS, kS}));
  EXPECT_DOUBLE_EQ(s.peakMemory, 3);
  EXPECT_DOUBLE_EQ(s.bound, 3);
  EXPECT_DOUBLE_EQ(s.objective, 24);
}

TEST(SelectionEdges, ASelfEdgeChargesOnlyItsDiagonalAndItsInfinitiesCloseChoices) {
  SelectionProblem p;
  p.vars = {{"layers", {1, 2, 3}, {}}};
  // Diagonal: choice 0 forbidden, choice 1 pays 10 more, choice 2 pays 0 more. Off the diagonal
  // nothing applies, however cheap.
  p.edges = {{0, 0, {{kInf, -50, -50}, {-50, 10, -50}, {-50, -50, 0}}}};
  const Selection s = solveIlp(p);
  EXPECT_EQ(s.status, "optimal");
  EXPECT_EQ(s.choice, (std::vector<int>{2}));
  EXPECT_DOUBLE_EQ(s.objective, 3);
  EXPECT_EQ(evaluate(p, {0}), kInf);
}

TEST(SelectionEdges, ParallelEdgesInEitherDirectionAreSummed) {
  SelectionProblem p;
  p.vars = {{"u", {0, 0}, {}}, {"v", {0, 0, 0}, {}}};
  // u -> v alone prefers (0, 0); with v -> u added, (0, 0) costs 1 + 5 = 6, (1, 2) 2 + 1 = 3.
  p.edges = {{0, 1, {{1, 9, 9}, {9, 9, 2}}}, {1, 0, {{5, 9}, {9, 9}, {9, 1}}}};
  const Selection s = solveIlp(p);
  EXPECT_EQ(s.choice, (std::vector<int>{1, 2}));
  EXPECT_DOUBLE_EQ(s.objective, 3);
}

TEST(SelectionEdges, PairsForbiddenEverywhereMakeTheProblemInfeasible) {
  SelectionProblem p;
  p.vars = {{"u", {1, 2}, {}}, {"v", {1, 2}, {}}, {"w", {1, 2}, {}}};
  // u = v and v = w are forced by the first two edges; u != w by the third.
  p.edges = {{0, 1, {{0, kInf}, {kInf, 0}}},
             {1, 2, {{0, kInf}, {kInf, 0}}},
             {0, 2, {{kInf, 0}, {0, kInf}}}};
  EXPECT_EQ(solveIlp(p).status, "infeasible");
  EXPECT_EQ(solveMinPeakMemory(p).status, "infeasible");
  EXPECT_EQ(solveBruteForce(p).status, "infeasible");
}

TEST(SelectionEdges, AForbiddenPairIsAvoidedEvenWhereItsSidesAreCheapest) {
  SelectionProblem p;
  p.vars = {{"u", {0, 5}, {}}, {"v", {0, 5}, {}}};
  p.edges = {{0, 1, {{kInf, 0}, {0, 0}}}};
  const Selection s = solveIlp(p);
  EXPECT_DOUBLE_EQ(s.objective, 5);
  EXPECT_NE(s.choice, (std::vector<int>{0, 0}));
  // The smallest peak must avoid it too, although the edge's costs do not count there.
  p.memory = {{"m", 0, {{0, {0, 1}}, {1, {0, 3}}}}};
  const Selection m = solveMinPeakMemory(p);
  EXPECT_EQ(m.choice, (std::vector<int>{1, 0}));
  EXPECT_DOUBLE_EQ(m.peakMemory, 1);
}

TEST(SelectionMemory, RowsThatEachLeaveRoomCanTogetherFitNothing) {
  SelectionProblem p;
  p.vars = {{"x", {0, 0}, {}}, {"y", {0, 0}, {}}};
  // Each row is over 10 bytes for exactly one of the four choices (x, y) = (0, 0), (1, 1),
  // (0, 1), (1, 0), with 11 bytes at the least; alone, each leaves room for every choice of x
  // and of y, so only the program as a whole can find that nothing fits.
  p.memory = {{"a", 0, {{0, {5, 0}}, {1, {6, 0}}}},
              {"b", 0, {{0, {0, 5}}, {1, {0, 6}}}},
              {"c", 0, {{0, {5, 0}}, {1, {0, 6}}}},
              {"d", 0, {{0, {0, 5}}, {1, {6, 0}}}}};
  p.memoryLimit = 10;
  EXPECT_EQ(solveIlp(p).status, "infeasible");
  EXPECT_EQ(solveBruteForce(p).status, "infeasible");
  const Selection least = solveMinPeakMemory(p);
  EXPECT_EQ(least.status, "optimal");
  EXPECT_DOUBLE_EQ(least.peakMemory, 11);
  p.memoryLimit = 11;
  EXPECT_EQ(solveIlp(p).status, "optimal");
}

// A pair term counts only where both of its choices are taken (a copy that exists where two
// layouts differ): x = 0 and y = 0 are each cheapest and fit alone, together they do not, so the
// program pays for the next best pair. Of a var with itself, only the diagonal counts.
TEST(SelectionMemory, APairTermCountsOnlyWhereBothChoicesAreTaken) {
  SelectionProblem p;
  p.vars = {{"x", {0, 3}, {}}, {"y", {0, 5}, {}}};
  p.memory = {{"copy", 10, {{0, {1, 1}}}, {{0, 1, {{20, 0}, {0, 0}}}}}};
  p.memoryLimit = 15;
  for (const Selection& s : {solveIlp(p), solveBruteForce(p)}) {
    EXPECT_EQ(s.status, "optimal");
    EXPECT_EQ(s.choice, (std::vector<int>{1, 0}));
    EXPECT_DOUBLE_EQ(s.peakMemory, 11);
  }
  EXPECT_DOUBLE_EQ(peakMemory(p, {0, 0}), 31);
  EXPECT_DOUBLE_EQ(solveMinPeakMemory(p).peakMemory, 11);
  // The same bytes the other way round (v, u) and a self pair's diagonal.
  p.memory[0].pairs = {{1, 0, {{20, 0}, {0, 0}}}, {1, 1, {{0, 100}, {100, 4}}}};
  EXPECT_DOUBLE_EQ(peakMemory(p, {0, 0}), 31);
  EXPECT_DOUBLE_EQ(peakMemory(p, {1, 1}), 15);
  EXPECT_EQ(solveIlp(p).choice, (std::vector<int>{1, 0}));
  p.memoryLimit = 10.5;
  EXPECT_EQ(solveIlp(p).status, "infeasible");
  EXPECT_EQ(solveBruteForce(p).status, "infeasible");
}

TEST(SelectionProblemShape, NoVarsIsTheEmptyChoiceAndRowsKeepTheirConstants) {
  SelectionProblem p;
  p.memory = {{"weights", 100, {}}};
  Selection s = solveIlp(p);
  EXPECT_EQ(s.status, "optimal");
  EXPECT_TRUE(s.choice.empty());
  EXPECT_DOUBLE_EQ(s.peakMemory, 100);
  p.memoryLimit = 99;
  EXPECT_EQ(solveIlp(p).status, "infeasible");
  EXPECT_DOUBLE_EQ(solveMinPeakMemory(p).peakMemory, 100);
}

void expectInvalid(const SelectionProblem& p, const std::string& expected) {
  try {
    validate(p);
    ADD_FAILURE() << "no error; expected one containing \"" << expected << "\"";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
  }
}

TEST(SelectionValidate, ErrorsNameTheVarEdgeOrRowAndWhatIsWrong) {
  const SelectionProblem good = chain();
  EXPECT_NO_THROW(validate(good));

  SelectionProblem p = good;
  p.vars[1].cost.clear();
  expectInvalid(p, "var 1 (B) has no choices");
  p = good;
  p.vars[2].choiceNames = {"R"};
  expectInvalid(p, "var 2 (C) has 1 choice names for 2 choices");
  p = good;
  p.vars[0].cost[1] = std::nan("");
  expectInvalid(p, "var 0 (A): cost[1] is");
  p = good;
  p.edges[1].v = 3;
  expectInvalid(p, "edge 1 (var 1 -> var 3): var index 3 is out of range [0, 3)");
  p = good;
  p.edges[0].cost.pop_back();
  expectInvalid(p, "edge 0 (var 0 -> var 1): cost has 1 rows, var 0 (A) has 2 choices");
  p = good;
  p.edges[1].cost[1].push_back(0);
  expectInvalid(p, "edge 1 (var 1 -> var 2): cost row 1 has 3 entries, var 2 (C) has 2");
  p = good;
  p.edges[1].cost[0][1] = std::nan("");
  expectInvalid(p, "edge 1 (var 1 -> var 2): cost[0][1] is");
  p = good;
  p.edges[1].cost[0][1] = -kInf;
  expectInvalid(p, "edge 1 (var 1 -> var 2): cost[0][1] is");
  p = good;
  p.memory[0].terms[2].first = -1;
  expectInvalid(p, "memory row 0 (peak), term 2: var index -1 is out of range");
  p = good;
  p.memory[0].terms[1].second = {1, 2, 3};
  expectInvalid(p, "memory row 0 (peak), term 1: 3 bytes given, var 1 (B) has 2 choices");
  p = good;
  p.memory[0].constant = kInf;
  expectInvalid(p, "memory row 0 (peak): constant is");
  p = good;
  p.memory[0].pairs = {{0, 5, {{0, 0}, {0, 0}}}};
  expectInvalid(p, "memory row 0 (peak), pair 0: var index 5 is out of range [0, 3)");
  p = good;
  p.memory[0].pairs = {{0, 1, {{0, 0}}}};
  expectInvalid(p, "memory row 0 (peak), pair 0: bytes has 1 rows, var 0 (A) has 2 choices");
  p = good;
  p.memory[0].pairs = {{0, 1, {{0, 0}, {0, kInf}}}};
  expectInvalid(p, "memory row 0 (peak), pair 0: bytes[1][1] is");

  EXPECT_THROW(evaluate(good, {0, 0}), std::invalid_argument);
  EXPECT_THROW(peakMemory(good, {0, 0, 2}), std::invalid_argument);
  EXPECT_THROW(solveIlp(p), std::invalid_argument);
}

TEST(SelectionBruteForce, RefusesMoreCombinationsThanItsLimit) {
  const SelectionProblem p = chain();  // 8 combinations
  EXPECT_THROW(solveBruteForce(p, 7), std::invalid_argument);
  EXPECT_EQ(solveBruteForce(p, 8).choice, (std::vector<int>{kR, kR, kS}));
}

// ---- Random problems against enumeration -------------------------------------------------

// Makes choice `to` of var v a copy of choice `from`, everywhere: its cost, its row or column of
// every edge, its bytes in every row; then adds `worse` to each of those numbers.
void copyChoice(SelectionProblem& p, int v, int from, int to, double worse) {
  p.vars[v].cost[to] = p.vars[v].cost[from] + worse;
  for (auto& e : p.edges) {
    if (e.u == v) {
      for (size_t l = 0; l < e.cost[to].size(); ++l) e.cost[to][l] = e.cost[from][l] + worse;
    }
    if (e.v == v) {
      for (auto& row : e.cost) row[to] = row[from] + worse;
    }
  }
  for (auto& row : p.memory) {
    for (auto& [var, bytes] : row.terms) {
      if (var == v) bytes[to] = bytes[from] + worse;
    }
    for (auto& pair : row.pairs) {
      if (pair.u == v) {
        for (size_t l = 0; l < pair.bytes[to].size(); ++l) {
          pair.bytes[to][l] = pair.bytes[from][l] + worse;
        }
      }
      if (pair.v == v) {
        for (auto& r : pair.bytes) r[to] = r[from] + worse;
      }
    }
  }
}

// 2-6 vars of 1-5 choices; edges that are random, constant or additive (folded by the
// presolve), self edges, parallel edges both ways, some forbidden pairs; memory rows with
// integer bytes (so a limit equal to a peak is met exactly), repeated vars and pair terms (of
// two vars, with or without an edge between them, or of a var with itself); choices that
// copy another or are worse than it in everything (closed by the presolve); limits around the
// peak of a random choice, often below every peak.
SelectionProblem randomProblem(std::mt19937& rng) {
  auto uniform = [&](double lo, double hi) {
    return std::uniform_real_distribution<>(lo, hi)(rng);
  };
  auto integer = [&](int lo, int hi) { return std::uniform_int_distribution<>(lo, hi)(rng); };
  SelectionProblem p;
  const int vars = integer(2, 6);
  for (int v = 0; v < vars; ++v) {
    auto& var = p.vars.emplace_back();
    var.name = "v" + std::to_string(v);
    for (int k = integer(1, 5); k > 0; --k) var.cost.push_back(uniform(0, 100));
  }
  auto size = [&](int v) { return static_cast<int>(p.vars[v].cost.size()); };
  const int edges = integer(0, 2 * vars);
  for (int i = 0; i < edges; ++i) {
    SelectionProblem::Edge e;
    e.u = integer(0, vars - 1);
    e.v = integer(0, 9) == 0 ? e.u : integer(0, vars - 1);
    const int kind = integer(0, 9);
    std::vector<double> a(size(e.u)), b(size(e.v));
    for (auto& x : a) x = uniform(0, 30);
    for (auto& x : b) x = uniform(0, 30);
    const double constant = uniform(0, 30);
    e.cost.assign(size(e.u), std::vector<double>(size(e.v)));
    for (int k = 0; k < size(e.u); ++k) {
      for (int l = 0; l < size(e.v); ++l) {
        if (kind == 0) {
          e.cost[k][l] = constant;
        } else if (kind == 1) {
          e.cost[k][l] = a[k] + b[l];
        } else {
          e.cost[k][l] = integer(0, 6) == 0 ? kInf : uniform(0, 50);
        }
      }
    }
    p.edges.push_back(e);
    if (integer(0, 3) == 0) {  // the same pair again, the other way
      SelectionProblem::Edge back{e.v, e.u, Matrix(size(e.v), std::vector<double>(size(e.u)))};
      for (auto& row : back.cost) {
        for (auto& x : row) x = integer(0, 9) == 0 ? kInf : uniform(0, 50);
      }
      p.edges.push_back(back);
    }
  }
  for (int r = integer(0, 4); r > 0; --r) {
    auto& row = p.memory.emplace_back();
    row.what = "row" + std::to_string(r);
    row.constant = integer(0, 100);
    for (int t = integer(0, vars + 1); t > 0; --t) {
      const int v = integer(0, vars - 1);  // may repeat: the terms add up
      std::vector<double> bytes(size(v));
      for (auto& x : bytes) x = integer(0, 100);
      row.terms.emplace_back(v, bytes);
    }
    // Pair terms: bytes where both choices are taken (often 0: a copy only where they differ),
    // between two vars, the same two again, or a var and itself.
    for (int t = integer(0, 2); t > 0; --t) {
      SelectionProblem::PairTerm pair;
      pair.u = integer(0, vars - 1);
      pair.v = integer(0, 4) == 0 ? pair.u : integer(0, vars - 1);
      pair.bytes.assign(size(pair.u), std::vector<double>(size(pair.v), 0.0));
      for (auto& r : pair.bytes) {
        for (auto& x : r) x = integer(0, 2) == 0 ? 0 : integer(0, 60);
      }
      row.pairs.push_back(pair);
    }
  }
  for (int v = 0; v < vars; ++v) {
    if (size(v) >= 2 && integer(0, 2) == 0) {
      const int from = integer(0, size(v) - 1), to = (from + integer(1, size(v) - 1)) % size(v);
      copyChoice(p, v, from, to, integer(0, 1) == 0 ? 0 : integer(1, 5));
    }
  }
  if (!p.memory.empty() && integer(0, 3) != 0) {
    std::vector<int> some(vars);
    for (int v = 0; v < vars; ++v) some[v] = integer(0, size(v) - 1);
    p.memoryLimit = std::max(1.0, peakMemory(p, some) + integer(-40, 20));
  }
  return p;
}

// Every choice of the problem, in lexicographic order.
std::vector<std::vector<int>> allChoices(const SelectionProblem& p) {
  std::vector<std::vector<int>> all{{}};
  for (const auto& var : p.vars) {
    std::vector<std::vector<int>> longer;
    for (const auto& prefix : all) {
      for (int k = 0; k < static_cast<int>(var.cost.size()); ++k) {
        longer.push_back(prefix);
        longer.back().push_back(k);
      }
    }
    all = std::move(longer);
  }
  return all;
}

bool fits(const SelectionProblem& p, const std::vector<int>& choice) {
  return p.memoryLimit <= 0 || peakMemory(p, choice) <= p.memoryLimit;
}

constexpr int kRandomProblems = 200;

TEST(SelectionRandom, TheProgramFindsTheBruteForceOptimum) {
  std::mt19937 rng(20240611);
  int optimal = 0, infeasible = 0, unique = 0;
  for (int i = 0; i < kRandomProblems; ++i) {
    const SelectionProblem p = randomProblem(rng);
    SCOPED_TRACE("problem " + std::to_string(i));
    const Selection ilp = solveIlp(p);
    const Selection brute = solveBruteForce(p);
    ASSERT_EQ(ilp.status, brute.status);
    if (brute.status == "infeasible") {
      ++infeasible;
      EXPECT_TRUE(ilp.choice.empty());
      continue;
    }
    ++optimal;
    ASSERT_EQ(ilp.choice.size(), p.vars.size());
    EXPECT_TRUE(near(ilp.objective, brute.objective)) << ilp.objective << " vs " << brute.objective;
    EXPECT_EQ(ilp.objective, evaluate(p, ilp.choice));
    EXPECT_EQ(ilp.peakMemory, peakMemory(p, ilp.choice));
    EXPECT_TRUE(fits(p, ilp.choice)) << ilp.peakMemory << " > " << p.memoryLimit;
    EXPECT_GE(ilp.gap, 0);
    EXPECT_LE(ilp.gap, 1e-6);
    // The brute force on its own: nothing that fits is cheaper. Where its choice is the only
    // optimum the program must have found exactly it, and so its peak.
    int optima = 0;
    for (const auto& c : allChoices(p)) {
      if (!fits(p, c)) continue;
      EXPECT_GE(evaluate(p, c), brute.objective);
      optima += near(evaluate(p, c), brute.objective);
    }
    if (optima == 1) {
      ++unique;
      EXPECT_EQ(ilp.choice, brute.choice);
      EXPECT_EQ(ilp.peakMemory, brute.peakMemory);
    }
  }
  // The draw covers both outcomes, and most optima are unique (continuous costs).
  EXPECT_GE(infeasible, 20);
  EXPECT_GE(optimal, 100);
  EXPECT_GE(unique, optimal * 3 / 4);
}

TEST(SelectionRandom, TheSmallestPeakIsTheEnumeratedOneAndTheTightestLimitThatFits) {
  std::mt19937 rng(7);
  for (int i = 0; i < kRandomProblems; ++i) {
    SelectionProblem p = randomProblem(rng);
    SCOPED_TRACE("problem " + std::to_string(i));
    double smallest = kInf;
    for (const auto& c : allChoices(p)) {
      if (evaluate(p, c) < kInf) smallest = std::min(smallest, peakMemory(p, c));
    }
    const Selection s = solveMinPeakMemory(p);
    if (smallest == kInf) {  // every choice takes a forbidden pair
      EXPECT_EQ(s.status, "infeasible");
      continue;
    }
    ASSERT_EQ(s.status, "optimal");
    // Bytes are integers below 2^53: the program's peak is exact.
    EXPECT_EQ(s.peakMemory, smallest);
    EXPECT_EQ(s.peakMemory, peakMemory(p, s.choice));
    EXPECT_EQ(s.objective, evaluate(p, s.choice));
    EXPECT_LT(s.objective, kInf);
    if (smallest >= 2) {  // a limit of 1 or more is a limit
      p.memoryLimit = smallest;
      EXPECT_EQ(solveIlp(p).status, "optimal");
      p.memoryLimit = smallest - 1;
      EXPECT_EQ(solveIlp(p).status, "infeasible");
    }
  }
}

// Rows whose bytes differ by up to twelve orders of magnitude, and a row giving choice 0 of
// every other var 1e18 bytes (how a caller keeps choices out of the smallest peak): every row
// must still count, the small ones beside the large ones.
TEST(SelectionRandom, RowsOfVeryDifferentMagnitudesAllCount) {
  std::mt19937 rng(3);
  auto integer = [&](int lo, int hi) { return std::uniform_int_distribution<>(lo, hi)(rng); };
  int barredSmallest = 0;
  for (int i = 0; i < 100; ++i) {
    SelectionProblem p = randomProblem(rng);
    SCOPED_TRACE("problem " + std::to_string(i));
    for (auto& row : p.memory) {
      const double scale = std::pow(10.0, integer(0, 12));  // integers times it stay exact
      row.constant *= scale;
      for (auto& [v, bytes] : row.terms) {
        for (auto& b : bytes) b *= scale;
      }
      for (auto& pair : row.pairs) {
        for (auto& r : pair.bytes) {
          for (auto& b : r) b *= scale;
        }
      }
    }
    SelectionProblem::MemoryRow barred{"barred", 0, {}};
    for (int v = 0; v < static_cast<int>(p.vars.size()); v += 2) {
      std::vector<double> bytes(p.vars[v].cost.size(), 0);
      if (bytes.size() >= 2) bytes[0] = 1e18;
      barred.terms.emplace_back(v, bytes);
    }
    p.memory.push_back(barred);

    double smallest = kInf;
    for (const auto& c : allChoices(p)) {
      if (evaluate(p, c) < kInf) smallest = std::min(smallest, peakMemory(p, c));
    }
    const Selection least = solveMinPeakMemory(p);
    if (smallest == kInf) {
      EXPECT_EQ(least.status, "infeasible");
      continue;
    }
    ASSERT_EQ(least.status, "optimal");
    EXPECT_EQ(least.peakMemory, smallest);
    barredSmallest += smallest < 1e18;

    if (p.memoryLimit > 0) {  // randomProblem's limit, over the new bytes: near the smallest
      p.memoryLimit = smallest + integer(0, 2) * smallest / 4;
    }
    const Selection ilp = solveIlp(p);
    const Selection brute = solveBruteForce(p);
    ASSERT_EQ(ilp.status, brute.status);
    if (brute.status != "optimal") continue;
    EXPECT_TRUE(near(ilp.objective, brute.objective)) << ilp.objective << " vs " << brute.objective;
    EXPECT_TRUE(fits(p, ilp.choice)) << ilp.peakMemory << " > " << p.memoryLimit;
  }
  EXPECT_GE(barredSmallest, 50);  // most smallest peaks keep out of the barred choices
}

TEST(SelectionRandom, AnAllowedGapStopsWithinIt) {
  std::mt19937 rng(99);
  SelectionOptions loose;
  loose.relativeGap = 0.5;
  for (int i = 0; i < 50; ++i) {
    const SelectionProblem p = randomProblem(rng);
    SCOPED_TRACE("problem " + std::to_string(i));
    const Selection s = solveIlp(p, loose);
    const Selection brute = solveBruteForce(p);
    if (brute.status == "infeasible") {
      EXPECT_EQ(s.status, "infeasible");
      continue;
    }
    EXPECT_TRUE(s.status == "optimal" || s.status == "feasible") << s.status;
    // CBC stops once (objective - bound) <= 0.5 |objective|, the bound below the optimum.
    EXPECT_LE(s.bound, brute.objective + kObjectiveTolerance);
    EXPECT_LE(s.gap, 0.5 + kObjectiveTolerance);
    EXPECT_EQ(s.objective, evaluate(p, s.choice));
    EXPECT_TRUE(fits(p, s.choice));
  }
}

// 40 vars of 20 choices in a chain with 20 skip edges, the fast choices holding the most bytes,
// and 40 memory rows of 10 vars each under a limit that rules out most fast choices: CBC's
// bound stays far below its best choice for seconds (25% after 5 s when this was written).
SelectionProblem hardProblem() {
  std::mt19937 rng(1);
  auto uniform = [&](double lo, double hi) {
    return std::uniform_real_distribution<>(lo, hi)(rng);
  };
  auto integer = [&](int lo, int hi) { return std::uniform_int_distribution<>(lo, hi)(rng); };
  constexpr int kVars = 40, kChoices = 20;
  SelectionProblem p;
  Matrix bytes(kVars, std::vector<double>(kChoices));
  for (int v = 0; v < kVars; ++v) {
    auto& var = p.vars.emplace_back();
    for (int k = 0; k < kChoices; ++k) {
      var.cost.push_back(uniform(100, 200) * (k + 1) / kChoices);
      bytes[v][k] = integer(1, 100) * 1e6 * (kChoices - k);
    }
  }
  for (int i = 0; i < 60; ++i) {
    SelectionProblem::Edge e;
    e.u = i < kVars - 1 ? i : integer(0, kVars - 2);
    e.v = i < kVars - 1 ? i + 1 : integer(e.u + 1, kVars - 1);
    e.cost.assign(kChoices, std::vector<double>(kChoices, 0));
    for (int k = 0; k < kChoices; ++k) {
      for (int l = 0; l < kChoices; ++l) e.cost[k][l] = k == l ? 0 : uniform(5, 80);
    }
    p.edges.push_back(e);
  }
  for (int r = 0; r < kVars; ++r) {
    auto& row = p.memory.emplace_back();
    for (int v = std::max(0, r - 5); v < std::min(kVars, r + 5); ++v)
      row.terms.emplace_back(v, bytes[v]);
  }
  p.memoryLimit = 0.6 * solveIlp(p).peakMemory;
  return p;
}

TEST(SelectionTimeLimit, StoppingEarlyIsNeverReportedAsOptimal) {
  const SelectionProblem p = hardProblem();
  SelectionOptions quick;
  quick.timeLimitSeconds = 0.2;
  const Selection s = solveIlp(p, quick);
  ASSERT_TRUE(s.status == "feasible" || s.status == "no_solution") << s.status;
  if (s.status == "feasible") {
    EXPECT_TRUE(fits(p, s.choice));
    EXPECT_EQ(s.objective, evaluate(p, s.choice));
    EXPECT_GT(s.gap, 0);
    EXPECT_LE(s.bound, s.objective);
  } else {
    EXPECT_TRUE(s.choice.empty());
  }
}

}  // namespace
}  // namespace sb::strategies::autoshard
