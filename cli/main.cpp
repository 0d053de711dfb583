// The stratbench command line, the full harness (stratbench-core; `stratbench`, the front in
// front.cpp, runs `solve checkpoint` itself and hands every other command here).
//
//   stratbench list [--family F] [--filter REGEX] [--json] [--plugin LIB.so...]
//   stratbench run SUITE [--filter REGEX] [--backend threads|gloo] [--out DIR] [--repetitions N]
//                        [--seed S] [--min-time SEC] [--world-size N] [--timeout SEC]
//                        [--cost-profile FILE...] [--plugin LIB.so...]
//   stratbench launch -n N [--nnodes K --node-rank I --master-addr A --master-port P]
//                        [--hosts H0,H1,...] [--timeout SEC] -- run SUITE --backend gloo ...
//   stratbench calibrate [--backend threads|gloo] [--mesh RxC] [--out FILE] [--max-bytes B]
//   stratbench report RESULTS... [--baseline FILE...] [--out DIR] [--history DIR] [--gate]
//                        [--gate-perf] [--perf-threshold PCT] [--mem-threshold PCT]
//   stratbench solve checkpoint --chain FILE.json --budget M|none [--solver S] [--slots N]
//                        [--max-solver-memory BYTES]
//   stratbench solve chunk --workload W --shape JSON --max-memory BYTES [--dtype D]
//   stratbench solve redistribute --shape JSON --mesh RxC (--from L --to L | --compare-anchors)
//                        [--profile FILE] [--objective time|bytes] [--dtype D]
//   stratbench solve shard --workload W --shape JSON --mesh RxC [--profile FILE |
//                        --intra-node-bandwidth B --inter-node-bandwidth B] [--max-memory BYTES]
//                        [--algo ilp|megatron|data-parallel|replicated] [--time-limit S]
//                        [--mip-rel-gap PCT] [--out plan.json] [--dtype D]
//   stratbench graph --workload gpt2|bert|llama|mlp --shape JSON [--json]
//
// Exit codes: 0 everything passed (run) or the gate passed (report), 1 a strategy failed or
// errored (run), the gate failed (report --gate) or no schedule fits (solve), 2 bad input or
// usage (a plugin refused included). Plugins (harness/plugin.h) come from --plugin and from
// STRATBENCH_PLUGIN_PATH (files or folders, ':'-separated).
//
// This file builds the parser from the subcommands (cli/commands.h, one file each), parses and
// dispatches; `launch` takes the command line whole (cli/launch.cpp).

#include <cstdlib>
#include <iostream>
#include <string>

#include <torch/version.h>
#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/serve.h"
#include "cli/solve_checkpoint.h"
#include "cli/solve_pipeline.h"
#include "cli/terminal_safe.h"
#include "harness/run/records.h"

namespace {

// The commands, as `--help` lists them and an unknown one is told.
constexpr const char* kCommands = "list, run, launch, calibrate, report, noise, solve, graph";

int coreMain(int argc, char** argv) {
  sb::cli::installTerminalSafeOutput();
  if (!sb::cli::argumentsAreUtf8(argc, argv)) return sb::cli::kExitBadInput;
  if (argc > 1 && std::string(argv[1]) == "launch") return sb::cli::launchMain(argc, argv);
  if (argc > 1 && argv[1][0] != '-') {
    const std::string first = argv[1];
    bool known = false;
    for (const char* c : {"list", "run", "calibrate", "report", "noise", "solve", "graph"}) {
      known = known || first == c;
    }
    if (!known) {
      std::cerr << "stratbench: unknown command '" << first << "' (expected one of: " << kCommands
                << "; stratbench --help says what each does)\n";
      return sb::cli::kExitBadInput;
    }
  }
  CLI::App app{
      "stratbench: verify, time and memory-profile parallelization and memory "
      "strategies against a plain LibTorch reference"};
  app.require_subcommand(1);
  // stratbench's version, the commit its sources are at (git, as every result row's git_sha),
  // and the LibTorch it runs on: asked for only when --version is given.
  app.add_flag_callback(
      "--version",
      [] {
        std::cout << "stratbench " << SB_VERSION << " (git "
                  << sb::harness::Provenance::collect().gitSha << ", LibTorch " << TORCH_VERSION
                  << ")\n";
        throw CLI::Success();
      },
      "Print stratbench's version, its sources' git commit and LibTorch's version, and exit");
  app.footer(sb::cli::kExitCodesText);

  const sb::cli::Command list = sb::cli::addList(app);
  const sb::cli::Command run = sb::cli::addRun(app);
  const sb::cli::Command calib = sb::cli::addCalibrate(app);
  const sb::cli::Command report = sb::cli::addReport(app);
  const sb::cli::Command noise = sb::cli::addNoise(app);

  auto* solveCmd = app.add_subcommand(
      "solve",
      "Plan a strategy: a checkpoint schedule, a chunk plan, a redistribution, a model's "
      "sharding, a pipeline schedule's dry run");
  solveCmd->require_subcommand(1);
  auto* ckpt = solveCmd->add_subcommand(
      "checkpoint", "A checkpoint schedule for a chain (JSON, rotor's notation) under a budget");
  sb::cli::CheckpointArgs ckptArgs;
  sb::cli::addCheckpointOptions(ckpt, ckptArgs);
  auto* pipe = solveCmd->add_subcommand(
      "pipeline",
      "A pipeline schedule's dry run: deadlocks, bubble, step time, activations held per rank");
  sb::cli::PipelineArgs pipeArgs;
  sb::cli::addPipelineOptions(pipe, pipeArgs);

  const sb::cli::Command chunkCmd = sb::cli::addSolveChunk(*solveCmd);
  const sb::cli::Command redistCmd = sb::cli::addSolveRedistribute(*solveCmd);
  const sb::cli::Command shardCmd = sb::cli::addSolveShard(*solveCmd);
  const sb::cli::Command parallelCmd = sb::cli::addSolveParallel(*solveCmd);

  const sb::cli::Command graphCmd = sb::cli::addGraph(app);
  // `launch` is parsed by its own parser (above, before this one); listed here for --help.
  app.add_subcommand("launch",
                     "Start N ranks of a command (one process each, torchrun's environment): "
                     "stratbench launch -n N [...] -- run SUITE --backend gloo ...; "
                     "stratbench launch --help for its options")
      ->allow_extras();
  // Every subcommand's --help ends with the exit codes.
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    sub->footer(sb::cli::kExitCodesText);
    for (CLI::App* inner : sub->get_subcommands([](CLI::App*) { return true; })) {
      inner->footer(sb::cli::kExitCodesText);
    }
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : sb::cli::kExitBadInput;
  }

  // Exactly one subcommand was chosen (require_subcommand); `run` is the one left.
  if (*list.app) return list.run();
  if (*ckpt) return sb::cli::solveCheckpoint(ckptArgs);
  if (*pipe) return sb::cli::solvePipeline(pipeArgs);
  if (*chunkCmd.app) return chunkCmd.run();
  if (*shardCmd.app) return shardCmd.run();
  if (*parallelCmd.app) return parallelCmd.run();
  if (*graphCmd.app) return graphCmd.run();
  if (*redistCmd.app) return redistCmd.run();
  if (*calib.app) return calib.run();
  if (*report.app) return report.run();
  if (*noise.app) return noise.run();
  return run.run();
}

}  // namespace

int main(int argc, char** argv) {
  // The test scripts' fork server (cli/serve.h): not a command, not listed.
  if (argc == 4 && std::string(argv[1]) == "__serve") {
    return sb::cli::serveForks(argv[2], static_cast<pid_t>(std::atol(argv[3])), coreMain);
  }
  return coreMain(argc, argv);
}
