#pragma once

// `stratbench solve pipeline`, shared by the front (cli/front.cpp, no LibTorch) and the full
// command line (cli/main.cpp): a pipeline schedule's dry run (strategies/pipeline/schedule.h).

#include <string>

namespace CLI {
class App;
}

namespace sb::cli {

struct PipelineArgs {
  std::string schedule;  // a built-in schedule (empty: 1f1b), when --csv is not given
  std::string csv;       // a schedule of torch.distributed.pipelining's CSV format
  int stages = 0;        // ranks, one stage each (times --virtual-stages)
  int microbatches = 0;
  int virtualStages = 1;
  std::string profile;  // per-stage costs (JSON)
  std::string chain;    // or a model's per-layer costs, rotor's chain notation, cut into stages
  std::string cut = "balanced";  // with --chain: balanced | layers
  std::string out;               // the run as JSON (default: stdout)
  std::string trace;             // a Chrome trace of it
  std::string writeCsv;          // the schedule, in the CSV format
};

void addPipelineOptions(CLI::App* app, PipelineArgs& args);

// Exit 0 with the run as JSON; 1 when the schedule deadlocks or uses an activation before it is
// made (stderr names the rank, the action and what it waits for); 2 for bad input.
int solvePipeline(const PipelineArgs& args);

// The subcommand's own parser: argv holds "stratbench solve pipeline ...".
int solvePipelineMain(int argc, char** argv);

}  // namespace sb::cli
