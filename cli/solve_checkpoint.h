#pragma once

// `stratbench solve checkpoint`, shared by the front (harness/cli/front.cpp, no LibTorch) and
// the full command line (harness/cli/main.cpp).

#include <string>

namespace CLI {
class App;
}

namespace sb::cli {

struct CheckpointArgs {
  std::string chain;
  std::string budget;  // a positive number in the chain's memory unit, or "none"
  std::string solver = "rotor";
  int slots = 500;
  double maxSolverMemory = 0;  // 0: a quarter of physical memory
  double timeLimit = 300;      // seconds rotor's tables may take to fill
};

// The subcommand's options, each checked strictly (harness/cli/numbers.h).
void addCheckpointOptions(CLI::App* app, CheckpointArgs& args);

// Prints the schedule as JSON. Exit 0; 1 when no schedule of the solver fits the budget, or
// rotor's tables take longer than timeLimit to fill; 2 for a malformed chain file or a table
// over maxSolverMemory. On a terminal, rotor's progress goes to stderr.
int solveCheckpoint(const CheckpointArgs& args);

// The subcommand's own parser: argv holds "stratbench solve checkpoint ...".
int solveCheckpointMain(int argc, char** argv);

}  // namespace sb::cli
