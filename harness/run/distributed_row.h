#pragma once

// A multi-process run (c10d backends: gloo, nccl): this process is one rank; every process runs
// the same plan, each rank of a row's mesh sends its outcome to rank 0 through the store, and
// rank 0 composes and writes the record and gives every rank the verdict (continue, rebuild the
// groups, stop). Its own file because the store protocol and its failure paths (a rank that
// fails, dies or hangs) are a topic of their own; see runPlanned in runner.h.

#include <vector>

#include "harness/run/plan.h"
#include "harness/run/progress.h"
#include "harness/run/run_options.h"
#include "harness/run/suite.h"

namespace sb::harness {

// runPlanned on a c10d backend: joins the session of the launcher's ranks (its environment
// read by dist_env.h; InputError where it is missing or wrong), runs the suite loop with the
// multi-process row, and waits for the ranks to finish where rank 0 serves the store. Only
// rank 0 tells `observer` anything and writes the results. Returns the exit code: rank 0's
// verdict, and 1 on a rank that lost rank 0.
int runDistributed(const Suite& suite, const std::vector<PlannedCase>& plan,
                   const RunOptions& options, RunObserver& observer);

}  // namespace sb::harness
