#pragma once

#include <functional>
#include <string>
#include <vector>

#include "harness/comm/comm.h"
#include "harness/comm/mesh.h"
#include "harness/comm/rank_context.h"

namespace sb::harness {

// The ranks of one mesh as the runner drives them, whatever runs them: `threads` runs every
// rank in this process, a c10d backend (gloo, nccl) runs one rank per process. The runner's
// phases (prepare, steps, timing) call run() in every process of the mesh in the same order.
class World {
 public:
  virtual ~World() = default;
  virtual const DeviceMesh& mesh() const = 0;
  virtual std::string backendName() const = 0;
  // The mesh ranks this process executes.
  virtual std::vector<int> localRanks() const = 0;

  // Runs fn(ctx) on every local rank and waits for them. Rethrows the first error.
  virtual void run(const std::function<void(RankContext&)>& fn) = 0;

  // Calls and bytes of every collective a local rank issued since the last resetStats(): as
  // the executor asked for them (compared with the strategy's prediction) and as the backend
  // carried them out (an emulated collective counts what actually crossed the wire).
  virtual const CommStats& stats(int rank) const = 0;
  virtual const CommStats& wireStats(int rank) const { return stats(rank); }
  virtual void resetStats() = 0;

  // The maximum of `value` over every process of the mesh (the slowest rank's step time);
  // collective across processes, uncounted.
  virtual double maxOverProcesses(double value) { return value; }
  // True on every process when any process of the mesh passes true; collective, uncounted.
  virtual bool anyOverProcesses(bool value) { return value; }
};

}  // namespace sb::harness
