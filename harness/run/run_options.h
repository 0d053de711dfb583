#pragma once

// The options of a run (`stratbench run`'s flags): its own file because the planner, the row
// runners, the fault injection and the predictions all read them, and runner.h includes them
// from here.

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "harness/dist/cost_profile.h"

namespace sb::harness {

struct RunOptions {
  std::string filter;      // regex searched in strategy ids; empty selects all
  std::string caseFilter;  // regex searched in case names (--case); empty selects all
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
  // The files those profiles were read from, by option ({"--cost-profile", path}): like the
  // suite and its golden file, never among the files the run writes into outDir.
  std::vector<std::pair<std::string, std::string>> readFiles;
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
  // Test-only: (strategy id, fraction) pairs; each timed step of that strategy spins, after
  // the step, for that fraction of the step's own time (0.2: 20% slower). The row keeps its id
  // (it must meet its baseline) and records params.planted_slowdown_pct, so that the nightly's
  // performance gate can be tested on a real slowdown.
  std::vector<std::pair<std::string, double>> plantedSlowdowns;
  // Write the reference's per-step losses of every training case to the suite's golden file
  // (its `golden:` key) instead of comparing with it.
  bool writeGolden = false;
  // Locate the first diverging node (divergence.h) on every row whose executor captures, not
  // only on failing ones.
  bool capture = false;
  // Where `run --trace` writes one more step of every row, traced (measure/step_trace.h): per
  // row a folder, per rank a Chrome trace-event file and a memory trace. Empty: none.
  std::string traceDir;
};

}  // namespace sb::harness
