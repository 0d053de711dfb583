#pragma once

// A row's predictions: its step time from a calibration profile (where the strategy models its
// costs), and every prediction judged against its measurement. Its own file because the cost
// model is a topic of its own, and the planner reads the profiles too.

#include <string>

#include "harness/case.h"
#include "harness/dist/cost_profile.h"
#include "harness/run/records.h"
#include "harness/run/run_options.h"
#include "harness/strategy.h"

namespace sb::harness {

// The calibration profile of a backend and mesh, if one was given.
const CostProfile* profileFor(const RunOptions& options, const CaseSpec& c);

// The cost model, per rank, the slowest rank's: the step's fixed cost (an empty step, where
// the profile measured it), three matmuls (the profile's matmul fit) where the strategy models
// its flops, its communication (each group's fits) and its local copies (the copy fit) where
// it models them.
void predictTime(Record& rec, const CaseSpec& c, const Strategy& strategy, int n,
                 const CostProfile& profile);

// Every prediction against its measurement: the relative error, in details["prediction"],
// and Record::mispredicted where it is past the strategy's stated tolerance. Returns the
// sentence for the message ("" when nothing is mispredicted).
std::string judgePredictions(Record& rec, const Strategy::PredictionTolerance& tol);

// A prediction's name as the mispredicted column writes it: lower-case letters, digits and '_',
// starting with a letter, and no yes/no word (`mispredicted: false` is a hand's "none", which
// is the empty column). An executor's own prediction with another name is flagged, not written.
bool validPredictionName(const std::string& name);

}  // namespace sb::harness
