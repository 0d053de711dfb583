#pragma once

// Where a failing row first leaves the reference. The row's checks say which final tensor is
// off; for a multi-node executor (a plan, a pipeline, a checkpointed stack) that leaves the
// engineer bisecting. Here the step is run once more with capture on (RankExecutor::
// setCapture), each rank compares its pieces of every intermediate value with the same value
// of the reference run (Strategy::referenceTrace), in the step's execution order, and the row
// names the first that leaves its tolerance: node, phase, rank, tensor and its error figures
// (`details.first_divergence`, the failure message, the HTML report). Only on a row whose
// tensor checks fail, or with `run --capture`: a passing row pays nothing.

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/case.h"
#include "harness/comm/world.h"
#include "harness/run/local_run.h"
#include "harness/strategy.h"
#include "harness/trace_value.h"
#include "reference/workload.h"

namespace sb::harness {

// The first piece of `captured` (in the order the rank made them) that leaves its tolerance
// against its value in `reference` (matched by TraceValue::key(); a recomputation against the
// forward's value) on `rank`: {"found": true, node, phase, tensor, rank, box, index (its place
// among this rank's captured values), of (how many it captured), at_ns (when it was made),
// compared (values compared up to it), check (the tensor check's JSON)}; {"found": false,
// compared, of} where none does, with `missing` (the places in `reference` of the values this
// rank never made) and `untraced` (how many it made that the reference does not name).
nlohmann::json firstDivergenceOnRank(const CaseSpec& c, const Strategy& strategy,
                                     const std::vector<TraceValue>& reference,
                                     const std::vector<TraceValue>& captured, int rank);

// Over the ranks' answers (null: not captured on that rank): the earliest in time (at_ns),
// shown on the lowest rank whose first divergence is the same value, with `ranks` (every rank
// whose first divergence is that value) and `elsewhere` (ranks whose first is another). Where
// none found one: `compared` summed, `missing` what no rank made. Null where no rank captured.
nlohmann::json firstDivergence(const std::vector<nlohmann::json>& perRank);

// A one-node strategy's first divergence (Strategy::singleNode), from the row's failing checks:
// the node, phase forward where an output-like result fails (else backward), that tensor's
// first failing rank and the ranks failing on it. Null where every check passed.
nlohmann::json singleNodeDivergence(const std::string& node,
                                    const std::vector<TensorCheck>& checks);

// One line for the failure message: "first divergence: node h0.mlp.fc2 (forward) on rank 1,
// tensor h0.mlp.fc2: max abs err ..."; empty where nothing was found.
std::string divergenceText(const nlohmann::json& d);

// The capture step of a row on this process's ranks (runLocal): every executor captures one
// step; each local rank's RankOutcome::divergence is its firstDivergenceOnRank. A failure
// while capturing is recorded there ({"error": ...}), never the row's; a rank that throws
// aborts the world, so that no peer waits in a collective it never reaches, and false is
// returned (nothing more should run on the world).
bool captureDivergence(World& world, const CaseSpec& c, const reference::WorkloadData& data,
                       const Strategy& strategy, std::vector<std::unique_ptr<RankExecutor>>& execs,
                       const std::vector<int>& slot, LocalRun& out);

}  // namespace sb::harness
