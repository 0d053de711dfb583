#pragma once

// One row on this process's ranks, whichever the backend: what it ran (LocalRun) and the
// phases that run it (runLocal, defined in runner.cpp). A header of its own because the row on
// threads (runner.cpp), the multi-process row (distributed_row.cpp) and the record's
// composition (compose.cpp) all share it.

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/case.h"
#include "harness/comm/world.h"
#include "harness/measure/timing.h"
#include "harness/run/rank_outcome.h"
#include "harness/run/run_options.h"
#include "harness/strategy.h"
#include "reference/workload.h"

namespace sb::harness {

// What this process ran of one row: its ranks' outcomes, the timing (identical in every
// process: each step's time is the maximum over the mesh), and rank 0's executor details.
struct LocalRun {
  std::vector<RankOutcome> ranks;
  std::optional<TimingStats> timing;
  std::optional<double> predictedTimeUs;
  std::vector<std::pair<std::string, std::string>> params;
  nlohmann::json executorDetails = nlohmann::json::object();
  // On CUDA: the caching allocator's own numbers for the measured step (this process's device).
  nlohmann::json deviceMemory;
};

// The phases of one row on this process's ranks: prepare, a warm-up step, the measured step
// (memory, communication, numerics), Google Benchmark timing, and the check that the timed
// steps still give the verified results. An error is recorded on the local ranks and
// `onError` runs (a c10d backend drops its groups, so that peers fail at once).
LocalRun runLocal(World& world, const CaseSpec& c, const reference::WorkloadData& data,
                  const Strategy& strategy, const RunOptions& options,
                  const std::function<void()>& onError);

}  // namespace sb::harness
