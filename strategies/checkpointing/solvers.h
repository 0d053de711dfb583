#pragma once

#include <functional>

#include <optional>
#include <string>
#include <vector>

#include "strategies/checkpointing/chain.h"

namespace sb::strategies::checkpointing {

// A solver's answer: the schedule and what the memory model says it costs (Simulation of the
// schedule on the chain, so the prediction and the check are one computation).
struct Schedule {
  std::string solver;
  std::vector<Op> ops;
  double predictedTime = 0;
  double predictedPeak = 0;
  int recomputedForwards = 0;
  double tableTime = -1;  // rotor: the dynamic program's own value (equal to predictedTime)
  std::vector<std::string> names() const;
};

struct SolveOptions {
  double budget = 0;  // counts the input x[0]; <= 0 means unconstrained
  int slots = 500;    // rotor: memory is discretised into this many slots of budget / slots
  // rotor: the most bytes its table may take; <= 0: defaultSolverBytes().
  double maxSolverBytes = 0;
  // rotor: seconds its tables may take to fill (<= 0: no limit); past it, SolverTimeLimit.
  double timeLimitSec = 0;
  // rotor: called about once a second while a table fills, with the fraction of its work
  // done (e.g. a progress line on a terminal); may be empty.
  std::function<void(double)> progress = {};
};

// A quarter of the machine's physical memory: what rotor's table may take by default.
double defaultSolverBytes();

// Thrown when a solver would need more memory than allowed: nothing is allocated.
class SolverLimitError : public ChainError {
 public:
  SolverLimitError(const std::string& what, double neededBytes)
      : ChainError(what), neededBytes_(neededBytes) {}
  double neededBytes() const { return neededBytes_; }

 private:
  double neededBytes_;
};

// Thrown when rotor's tables take longer than SolveOptions::timeLimitSec to fill.
class SolverTimeLimit : public ChainError {
 public:
  using ChainError::ChainError;
};

// The names solve() knows: none, full, sqrt, greedy, revolve, rotor.
const std::vector<std::string>& solverNames();

// The schedule of `solver` for `chain` under the budget, or nullopt when none of its schedules
// fits. Throws ChainError for an unknown solver name.
//   none     keep every stage's tape: the fastest and the largest
//   full     keep only every stage's input, recompute each stage once in the backward
//   sqrt     Chen et al.: about sqrt(L) segments of equal length, segment inputs kept
//   greedy   Chen et al.'s greedy segmentation, the threshold searched for the fastest fit
//   revolve  Griewank's binomial schedule with as many snapshots as fit (homogeneous model)
//   rotor    Beaumont et al.'s optimal dynamic program over memory slots
std::optional<Schedule> solve(const std::string& solver, const Chain& chain,
                              const SolveOptions& options);

// rotor's first implementation (one table indexed by slot, then sub-chain), kept as the
// reference the fast one is tested and benchmarked against: the same optimum, much slower.
std::optional<Schedule> solveRotorReference(const Chain& chain, const SolveOptions& options);

// Griewank's schedule with `snapshots` snapshots besides the input, and its number of
// forward steps besides the one taped forward per stage (the revolve table's value).
std::vector<Op> revolveSchedule(int length, int snapshots);
long revolveForwardSteps(int steps, int snapshots);

// Schedules that keep the inputs of the segments [b_0, b_1), [b_1, b_2), ... (b_0 = 0,
// boundaries strictly increasing, last segment ending at L) and recompute each segment but
// the last once in the backward; none = {0}, full = {0, 1, ..., L-1}.
std::vector<Op> segmentSchedule(int length, const std::vector<int>& boundaries);

}  // namespace sb::strategies::checkpointing
