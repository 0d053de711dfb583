#pragma once

#include <chrono>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "harness/cost_profile.h"
#include "harness/records.h"
#include "harness/strategy.h"
#include "harness/suite.h"

namespace sb::harness {

struct RunOptions {
  std::string filter;  // regex searched in strategy ids; empty selects all
  std::string backend = "threads";
  std::string outDir = "out/latest";
  std::optional<int> repetitions;    // overrides the suite's
  std::optional<uint64_t> seed;      // overrides the suite's
  std::optional<double> minTimeSec;  // overrides the suite's
  std::optional<int> worldSize;      // every case's mesh must have this many ranks
  double warmupSec = 0.0;            // Google Benchmark warm-up per (case, strategy)
  std::chrono::milliseconds collectiveTimeout{std::chrono::minutes(5)};
  // Calibration profiles (`stratbench calibrate`); a case uses the one of its backend and mesh
  // to predict the step time of strategies that model their flops.
  std::vector<CostProfile> costProfiles;
  // Test-only: a rank that fails on purpose in the measured step of the `row`-th row it runs
  // (c10d backends): it throws, kills itself with SIGKILL, or hangs.
  struct RankFault {
    enum class Kind { kThrow, kCrash, kHang };
    Kind kind = Kind::kThrow;
    int rank = 0;
    int row = 1;
  };
  std::optional<RankFault> rankFault;
  // Test-only: (strategy id, fault name) pairs; the strategy runs with that deliberate bug
  // under its own id (Strategy::withPlantedFault), so reports and gates can be tested end to
  // end on a real failing row.
  std::vector<std::pair<std::string, std::string>> plantedFaults;
};

// A case with the strategies it selected and whether each applies.
struct PlannedCase {
  CaseSpec spec;
  struct Entry {
    const Strategy* strategy;
    Applicability applicability;
    std::shared_ptr<const Strategy> owned;  // holds `strategy` when it is a planted-fault copy
  };
  std::vector<Entry> strategies;
};

// Resolves every case's strategy selection against the registry and the options. Throws
// InputError (exit 2) before anything runs: an id or pattern that selects nothing, a filter
// that leaves nothing, a mesh whose size is not the world size, an unknown backend, a strategy
// named by its exact id that cannot run the case's shape (with the reason, naming the
// dimension).
std::vector<PlannedCase> planSuite(const Suite& suite, const RunOptions& options);

// Parses "throw@2", "crash@1", "hang@3@5" (KIND@RANK[@ROW]); throws InputError naming the text.
RunOptions::RankFault parseRankFault(const std::string& text);

// Runs one strategy on one case on the threads backend: prepare, a warm-up step, a measured
// step (memory, communication, numerics), Google Benchmark timing, and a final check that the
// timed steps still give the verified results. Errors become status=error, never exceptions.
Record runStrategy(const CaseSpec& c, const reference::WorkloadData& data, const Strategy& strategy,
                   const Provenance& provenance, const RunOptions& options);

// Runs a planned suite, writing results as it goes and printing one progress line per case
// and a summary table. Returns the exit code: 0 all pass, 1 any fail or error.
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

class World;

// Runs one step on every local rank and returns the slowest rank's seconds over every process
// of the mesh: the function the runner hands to Google Benchmark. `scratch` holds per-rank
// times (sized to the mesh).
double timedStep(World& world, std::vector<std::unique_ptr<RankExecutor>>& execs,
                 std::vector<double>& scratch);

// A record with every field the case and strategy determine, and status unsupported.
Record baseRecord(const CaseSpec& c, const Strategy& s, const Provenance& p,
                  const std::string& backend);

}  // namespace sb::harness
