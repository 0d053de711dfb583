#pragma once

// What the files of the integer program share and ilp.h does not show: ilp_problem.cpp (the
// problem's checks, a choice's value, the brute force), ilp_presolve.cpp (the presolve) and
// ilp.cpp (the program and CBC). Internal; no CBC here, which stays private to ilp.cpp.

#include <chrono>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "strategies/sharding/auto/ilp.h"

namespace sb::strategies::autoshard {

constexpr double kInf = std::numeric_limits<double>::infinity();

using Matrix = std::vector<std::vector<double>>;
using Clock = std::chrono::steady_clock;

// Wall seconds since `start`.
double secondsSince(Clock::time_point start);

// How many choices var `v` has.
int choiceCount(const SelectionProblem& problem, int v);

// evaluate() and peakMemory() of a problem and choice already checked.
double objectiveOf(const SelectionProblem& problem, const std::vector<int>& choice);
double peakOf(const SelectionProblem& problem, const std::vector<int>& choice);

// The memory rows with each var's terms merged, a pair term of a var with itself added as its
// diagonal: [row] -> var -> bytes per choice.
using Terms = std::vector<std::map<int, std::vector<double>>>;
// The memory rows' pair terms of two vars, merged per pair and oriented u < v:
// [row] -> (u, v) -> bytes[choice of u][choice of v].
using PairTerms = std::vector<std::map<std::pair<int, int>, Matrix>>;

Terms mergedTerms(const SelectionProblem& problem);  // ilp_presolve.cpp
PairTerms mergedPairs(const SelectionProblem& problem);

// The problem as the program sees it (ilp.h's presolve): self edges and additive edges folded
// into the var costs, parallel edges merged, choices that cannot be taken or are dominated
// closed.
struct Reduced {
  Matrix cost;                          // [var][choice]
  std::vector<std::vector<char>> open;  // [var][choice]
  struct Pair {
    int u = 0, v = 0;     // u < v
    Matrix cost;          // [choice of u][choice of v]
    bool memory = false;  // some memory row has a pair term on it: its e are always kept
  };
  std::vector<Pair> edges;  // one per pair of vars, none of them additive unless `memory`
  bool infeasible = false;  // some var has no open choice
};

// The reduced problem; `limit` (bytes, +infinity for none) closes the choices no row can fit.
Reduced reduce(const SelectionProblem& problem, const Terms& terms, const PairTerms& pairs,
               double limit);

}  // namespace sb::strategies::autoshard
