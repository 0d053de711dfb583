#pragma once

// Running one checkpoint schedule on a chain network, outside a case: what tests that judge the
// solvers by execution need (test/solver_execution_test.cpp runs every schedule of a small
// chain and compares the solvers' choices with what the schedules measure).

#include <vector>

#include "reference/chain_nets.h"
#include "strategies/checkpointing/chain.h"

namespace sb::strategies::checkpointing {

struct ExecutedSchedule {
  // The tracking allocator's peak during the training step, in the chain model's terms (what
  // Simulation::peak predicts): above what was live when the step started, plus x[0].
  double peak = 0;
  std::vector<int> forwards;  // how many times each stage's forward ran
  int totalForwards() const;
};

// Runs one training step of `net` (the loss sum(y * target), as the checkpointing executor
// runs it) under `ops`, a valid schedule (simulate(chain, ops).valid) for a chain of net's
// length, with the allocations attributed to `rank`. `x0Bytes` is the chain's x[0]. The
// tracking allocator must be installed (harness::MemoryTracker::install); the network's
// buffers are reset and its gradients zeroed first, as each step of the executor does.
ExecutedSchedule executeSchedule(const reference::ChainNet& net, const std::vector<Op>& ops,
                                 double x0Bytes, int rank);

}  // namespace sb::strategies::checkpointing
