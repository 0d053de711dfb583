#include "harness/cli/solve_checkpoint.h"

#include <fstream>
#include <iostream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "strategies/checkpointing/solvers.h"

namespace sb::cli {

constexpr int kExitBadInput = 2;

int solveCheckpoint(const std::string& path, double budget, const std::string& solver, int slots,
                    double maxSolverBytes) {
  namespace ck = sb::strategies::checkpointing;
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
  try {
    s = ck::solve(solver, chain, options);
  } catch (const ck::SolverLimitError& e) {
    std::cerr << "stratbench solve: " << path << ": " << e.what() << "\n";
    return kExitBadInput;
  }
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
  j["budget"] = budget;
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
  std::string chainPath, solver = "rotor";
  double budget = 0, maxSolverMemory = 0;
  int slots = 500;
  app.add_option("--chain", chainPath, "Chain file: ftime, btime, x, xbar, ftmp, btmp")->required();
  app.add_option("--budget", budget, "Memory budget, counting the input x[0] (0: none)")
      ->required()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--solver", solver, "none, full, sqrt, greedy, revolve or rotor")
      ->capture_default_str()
      ->check(CLI::IsMember(sb::strategies::checkpointing::solverNames()));
  app.add_option("--slots", slots, "rotor: memory slots")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-solver-memory", maxSolverMemory,
                 "rotor: bytes its table may take (default: a quarter of physical memory)")
      ->check(CLI::NonNegativeNumber);
  try {
    app.parse(argc - 2, argv + 2);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : kExitBadInput;
  }
  return solveCheckpoint(chainPath, budget, solver, slots, maxSolverMemory);
}

}  // namespace sb::cli
