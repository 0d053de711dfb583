#pragma once

// Test-only fault injection: a rank that throws, kills itself or hangs in a chosen row's
// measured step (`--plant-rank-fault`), so that the multi-process protocol's failure paths are
// tested end to end. Its own file so that the row's phases read without it.

#include "harness/run/run_options.h"

namespace sb::harness {

// parseRankFault, the flag's parser, is declared in runner.h.

// A planted rank fault: in the measured step of the rank's `row`-th row.
void maybeFireRankFault(const RunOptions& options, int rank);

}  // namespace sb::harness
