#pragma once

// Test-only: deliberate errors in rotor's recurrence, for the planted-fault tests of the checks
// that judge the solvers by executing every schedule of a small chain
// (test/solver_execution_test.cpp) and against the reference program in every row (the
// planted fault short_leaf_runs of checkpointing/rotor, checkpoint_executor.cpp), and a switch
// the solver's own tests use (test/checkpoint_solver_test.cpp). Not part of the solvers' API:
// nothing but those includes this header, and without it rotor is the program solvers.cpp
// describes.

namespace sb::strategies::checkpointing {

enum class RotorFault {
  kNone,
  // Every stage's tape xbar[i+1] is counted without the output x[i+1] it holds: a stage's
  // activation counted once too few in the chain move and in the taped leaf.
  kTapeWithoutItsOutput,
  // The fast table tries leaf moves of at most two stages' forwards (the reference table all of
  // them): every schedule still valid and within the budget, no longer the least time where a
  // longer run of forwards wins.
  kShortLeafRunsOnly,
  // Not an error but a switch: rotor plans a chain with the step's terms with their table only,
  // not also without them (solvers.cpp, solveRotor), so that a test can tell where the second
  // table made the schedule.
  kWithoutThePlainTable,
};

// Sets rotor's fault for the scope's lifetime, process-wide (tests run one at a time; the table
// reads it when it is built).
class ScopedRotorFault {
 public:
  explicit ScopedRotorFault(RotorFault fault);
  ~ScopedRotorFault();
  ScopedRotorFault(const ScopedRotorFault&) = delete;
  ScopedRotorFault& operator=(const ScopedRotorFault&) = delete;

 private:
  RotorFault previous_;
};

}  // namespace sb::strategies::checkpointing
