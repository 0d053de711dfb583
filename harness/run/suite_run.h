#pragma once

// The suite loop that both backends share: references built case by case, rows run through a
// function the backend supplies, results written and the observer told. Internal: runPlanned
// (runner.h) is the entry point; the multi-process run (distributed_row.cpp) calls runLoop with
// its own row function.

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "harness/case.h"
#include "harness/run/plan.h"
#include "harness/run/progress.h"
#include "harness/run/records.h"
#include "harness/run/run_options.h"
#include "harness/run/suite.h"
#include "harness/strategy.h"
#include "reference/workload.h"

namespace sb::harness {

// One row as the suite loop sees it: the record (on the writing process) and whether the run
// must stop.
struct RowResult {
  std::optional<Record> record;
  bool stop = false;
};
using RowFn = std::function<RowResult(const CaseSpec&, const reference::WorkloadData*,
                                      const std::string& buildError, const Strategy&)>;

// Runs the plan row by row through `row`, telling `observer` its progress and, when `writes`,
// writing the results. Returns the exit code: 0 all pass, 1 any fail or error or a stop (0 when
// not `writes`: rank 0 carries the verdict and the exit code).
int runLoop(const Suite& suite, const std::vector<PlannedCase>& plan, const RunOptions& options,
            const Provenance& prov, RunObserver& observer, bool writes, const RowFn& row);

}  // namespace sb::harness
