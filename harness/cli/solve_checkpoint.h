#pragma once

// `stratbench solve checkpoint`, shared by the front (harness/cli/front.cpp, no LibTorch) and
// the full command line (harness/cli/main.cpp).

#include <string>

namespace sb::cli {

// Prints the schedule as JSON. Exit 0; 1 when no schedule of the solver fits the budget; 2 for
// a malformed chain file or a table over maxSolverBytes (<= 0: a quarter of physical memory).
int solveCheckpoint(const std::string& path, double budget, const std::string& solver, int slots,
                    double maxSolverBytes);

// The subcommand's own parser: argv holds "stratbench solve checkpoint ...".
int solveCheckpointMain(int argc, char** argv);

}  // namespace sb::cli
