#pragma once

// The runner's entry point: plan a suite (plan.h), run it (runPlanned), or run one row on
// threads (runStrategy). The run's options are in run_options.h and its output goes through a
// RunObserver (progress.h); both are included from here. Where each part is defined:
// runner.cpp (a row on threads), faults.cpp (parseRankFault), compose.cpp (baseRecord),
// suite_run.cpp (runPlanned), distributed_row.cpp (the multi-process run).

#include <chrono>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "harness/dist/cost_profile.h"
#include "harness/run/plan.h"
#include "harness/run/progress.h"
#include "harness/run/records.h"
#include "harness/run/run_options.h"
#include "harness/run/suite.h"
#include "harness/strategy.h"

namespace sb::harness {

// Parses "throw@2", "crash@1", "hang@3@5" (KIND@RANK[@ROW]); throws InputError naming the text.
RunOptions::RankFault parseRankFault(const std::string& text);

// Runs one strategy on one case on the threads backend: prepare, a warm-up step, a measured
// step (memory, communication, numerics), Google Benchmark timing, and a final check that the
// timed steps still give the verified results. Errors become status=error, never exceptions.
Record runStrategy(const CaseSpec& c, const reference::WorkloadData& data, const Strategy& strategy,
                   const Provenance& provenance, const RunOptions& options);

// Runs a planned suite, writing results as it goes and printing one progress line per case
// and a summary table to `out` (a ConsoleObserver, progress.h). Returns the exit code: 0 all pass,
// 1 any fail or error.
//
// On a c10d backend (gloo, nccl) this process is one rank of a multi-process run (its rank,
// world size and master address read from the environment, see dist_env.h): every process
// runs the same plan, a case's mesh runs on world ranks 0..k-1, and each rank sends what it
// measured to rank 0 through the store, which alone writes the one record per row (time of
// the slowest rank, peak memory of the largest, communication per rank). A rank that fails
// breaks its process groups so its peers fail at once; the row is an error naming the rank,
// and the next row gets fresh groups. A rank that dies or hangs past the timeout stops the
// run, with every finished row on disk.
int runPlanned(const Suite& suite, const std::vector<PlannedCase>& plan, const RunOptions& options,
               std::ostream& out);

// runPlanned with the run's progress and summary told to `observer` instead of printed.
int runPlanned(const Suite& suite, const std::vector<PlannedCase>& plan, const RunOptions& options,
               RunObserver& observer);

// `run --trace DIR`'s folder levels of one row, DIR/<suite>/<case>/<strategy id>, each name
// spelled as one safe folder name ('/' as '+', '%' and '+' escaped, a name of dots as %2E...).
std::vector<std::string> traceLevels(const CaseSpec& c, const std::string& strategyId);
// What stops the traces going into the folder `at`: "" where it is a folder, "not found" where it
// is to be made, else the reason, to follow `at` in a message (" is a symbolic link: ...").
std::string traceLevelProblem(const std::string& at);

class World;

// Runs one step on every local rank and returns the slowest rank's seconds over every process
// of the mesh: the function the runner hands to Google Benchmark. `scratch` holds per-rank
// times (sized to the mesh). `after`, where given (sized to the mesh): each local rank's live
// bytes once every rank of the mesh is past the step, noted (the runner's leak check).
struct LiveAfterSteps {
  int64_t steps = 0, first = 0, last = 0;
  void note(int64_t bytes) {
    if (steps++ == 0) first = bytes;
    last = bytes;
  }
};
double timedStep(World& world, std::vector<std::unique_ptr<RankExecutor>>& execs,
                 std::vector<double>& scratch, std::vector<LiveAfterSteps>* after = nullptr);

// A record with every field the case and strategy determine, and status unsupported.
Record baseRecord(const CaseSpec& c, const Strategy& s, const Provenance& p,
                  const std::string& backend);

}  // namespace sb::harness
