#pragma once

// Planning a suite: every case's strategy selection resolved against the registry and the
// options before anything runs, so that a bad request fails at once (exit 2) and not halfway
// through a run. Its own file because it shares nothing with running a row but the options.

#include <memory>
#include <string>
#include <vector>

#include "harness/case.h"
#include "harness/run/run_options.h"
#include "harness/run/suite.h"
#include "harness/strategy.h"

namespace sb::harness {

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
// named by its exact id for another kind of case (with the reason), a case parameter a
// strategy finds malformed (its applies() throws InputError). A strategy of the right kind of
// case that cannot run its model or shape is planned as an `unsupported` row, named by id or
// selected by a pattern alike.
std::vector<PlannedCase> planSuite(const Suite& suite, const RunOptions& options);

// Why this process cannot run a case on its device ("" when it can): a case on `device: cuda`
// where LibTorch has no CUDA or no device is found is skipped, saying which.
std::string deviceMissing(const CaseSpec& c);

}  // namespace sb::harness
