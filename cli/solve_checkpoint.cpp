#include "cli/solve_checkpoint.h"
#include "harness/in_file.h"

#include <unistd.h>

#include <fstream>
#include <iostream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/exit_codes.h"
#include "cli/numbers.h"
#include "harness/hidden_text.h"
#include "strategies/checkpointing/solvers.h"

namespace sb::cli {

constexpr int kExitBadInput = 2;

void addCheckpointOptions(CLI::App* app, CheckpointArgs& a) {
  app->add_option("--chain", a.chain, "Chain file: ftime, btime, x, xbar, ftmp, btmp")
      ->check(sb::cli::pathName())
      ->required();
  // 0 is not "no budget": a schedule printed for it would peak over it. Say `none` for that.
  app->add_option("--budget", a.budget,
                  "Memory budget, counting the input x[0], in the chain's unit (> 0), or none")
      ->required()
      ->check(realNumber(0, 1e30, /*openLow=*/true, "memory units (or 'none')") |
              CLI::IsMember({"none"}));
  app->add_option("--solver", a.solver, "none, full, sqrt, greedy, revolve or rotor")
      ->capture_default_str()
      ->check(CLI::IsMember(sb::strategies::checkpointing::solverNames()));
  app->add_option("--slots", a.slots, "rotor: memory slots")
      ->capture_default_str()
      ->check(wholeNumber(1, 1000000, "slots"));
  app->add_option("--max-solver-memory", a.maxSolverMemory,
                  "rotor: bytes its table may take (default: a quarter of physical memory)")
      ->check(byteCount(1));
  app->add_option("--time-limit", a.timeLimit,
                  "rotor: seconds its tables may take to fill before it stops (exit 1)")
      ->capture_default_str()
      ->check(realNumber(0, 86400, /*openLow=*/true, "seconds"));
}

int solveCheckpoint(const CheckpointArgs& a) {
  namespace ck = sb::strategies::checkpointing;
  const std::string& path = a.chain;
  const std::string& solver = a.solver;
  const int slots = a.slots;
  const double budget = a.budget == "none" ? 0 : std::stod(a.budget);
  const double maxSolverBytes = a.maxSolverMemory;
  if (const auto why = harness::notARegularFile(path); !why.empty()) {
    std::cerr << "stratbench solve: --chain " << path << ": " << why << "\n";
    return kExitBadInput;
  }
  std::ifstream in(path);
  if (!in) {
    std::cerr << "stratbench solve: cannot read " << path << "\n";
    return kExitBadInput;
  }
  ck::Chain chain;
  try {
    chain = ck::Chain::fromJson(nlohmann::json::parse(in), path);
  } catch (const nlohmann::json::parse_error& e) {
    std::cerr << "stratbench solve: " << path << ": not valid JSON: " << e.what() << "\n";
    return kExitBadInput;
  } catch (const ck::ChainError& e) {
    std::cerr << "stratbench solve: " << e.what() << "\n";
    return kExitBadInput;
  }
  std::optional<ck::Schedule> s;
  ck::SolveOptions options;
  options.budget = budget;
  options.slots = slots;
  options.maxSolverBytes = maxSolverBytes;
  options.timeLimitSec = a.timeLimit;
  if (::isatty(STDERR_FILENO)) {
    // A long chain at many slots takes minutes: said while it runs, on a terminal.
    options.progress = [](double done) {
      std::cerr << "\rstratbench solve checkpoint: rotor's table " << static_cast<int>(100 * done)
                << "% filled" << std::flush;
    };
  }
  const auto endProgress = [&] {
    if (options.progress) sb::harness::clearTerminalLine();
  };
  try {
    s = ck::solve(solver, chain, options);
  } catch (const ck::SolverLimitError& e) {
    endProgress();
    std::cerr << "stratbench solve: " << path << ": " << e.what() << "\n";
    return kExitBadInput;
  } catch (const ck::SolverTimeLimit& e) {
    endProgress();
    std::cerr << "stratbench solve: " << path << ": " << e.what() << "\n";
    return 1;
  }
  endProgress();
  if (!s) {
    const auto none = ck::solve("none", chain, {0, slots});
    const auto full = ck::solve("full", chain, {0, slots});
    std::cerr << "stratbench solve: no " << solver << " schedule of the " << chain.length()
              << "-stage chain in " << path << " fits a budget of " << budget
              << " (keeping every tape peaks at " << none->predictedPeak
              << ", checkpointing every stage at " << full->predictedPeak << ")\n";
    return 1;
  }
  nlohmann::json j;
  j["solver"] = solver;
  j["budget"] = a.budget == "none" ? nlohmann::json(nullptr) : nlohmann::json(budget);
  j["length"] = chain.length();
  j["schedule"] = s->names();
  j["predicted_time"] = s->predictedTime;
  j["predicted_peak"] = s->predictedPeak;
  j["recomputed_forwards"] = s->recomputedForwards;
  std::cout << j.dump(2) << "\n";
  return 0;
}

int solveCheckpointMain(int argc, char** argv) {
  CLI::App app{"A checkpoint schedule for a chain (JSON, rotor's notation) under a budget",
               "stratbench solve checkpoint"};
  CheckpointArgs args;
  addCheckpointOptions(&app, args);
  app.footer(kExitCodesText);
  try {
    app.parse(argc - 2, argv + 2);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : kExitBadInput;
  }
  return solveCheckpoint(args);
}

}  // namespace sb::cli
