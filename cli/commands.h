#pragma once

// The subcommands of stratbench-core, one file each (cli/list.cpp, cli/run.cpp, ...): each adds
// its subcommand with its options to the parser and hands back what runs it, so that main.cpp
// only builds the parser, parses and dispatches. `solve checkpoint` is wired apart
// (cli/solve_checkpoint.h, shared with the front), and so is `launch`, which CLI11 does not parse
// whole.

#include <functional>

namespace CLI {
class App;
}

namespace sb::cli {

// A subcommand added to the parser: `app` tells whether the command line chose it, `run` runs it
// (after parsing; the options it reads are its own) and returns the exit code.
struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

// Top-level subcommands, added to the whole command line in the order `--help` lists them.
Command addList(CLI::App& app);       // cli/list.cpp
Command addRun(CLI::App& app);        // cli/run.cpp
Command addCalibrate(CLI::App& app);  // cli/calibrate.cpp
Command addReport(CLI::App& app);     // cli/report.cpp
Command addNoise(CLI::App& app);      // cli/report.cpp
Command addGraph(CLI::App& app);      // cli/graph.cpp

// Subcommands of `solve`, added to it.
Command addSolveChunk(CLI::App& solve);         // cli/solve_chunk.cpp
Command addSolveRedistribute(CLI::App& solve);  // cli/solve_redistribute.cpp
Command addSolveShard(CLI::App& solve);         // cli/solve_shard.cpp
Command addSolveParallel(CLI::App& solve);      // cli/solve_parallel.cpp

// `stratbench launch -n N [...] -- COMMAND...` (cli/launch.cpp): parsed by a CLI11 parser of its
// own, since everything after "--" is the ranks' command. argv holds "stratbench launch ...".
int launchMain(int argc, char** argv);

}  // namespace sb::cli
