#pragma once

// The record of one row from every rank's outcome: its numerics, communication, memory and
// predictions judged, and its status and message. Its own file because it is the one place a
// row's verdict is decided, the same for the row on threads and the multi-process row.
// baseRecord, the record before the row runs, is declared in runner.h and defined here.

#include <string>
#include <vector>

#include "harness/case.h"
#include "harness/dist/cost_profile.h"
#include "harness/run/local_run.h"
#include "harness/run/rank_outcome.h"
#include "harness/run/records.h"
#include "harness/strategy.h"
#include "reference/workload.h"

namespace sb::harness {

// The first failure and the ranks that failed after it (on a broken group).
std::string errorMessage(const std::vector<RankOutcome>& ranks, bool perRankErrors);

// The record of one row from every rank's outcome (all ranks of the mesh, in rank order).
Record compose(Record rec, const CaseSpec& c, const reference::WorkloadData& data,
               const Strategy& strategy, const std::vector<RankOutcome>& ranks,
               const LocalRun& rank0, bool perRankErrors, const CostProfile* profile);

}  // namespace sb::harness
