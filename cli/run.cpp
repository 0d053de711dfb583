// `stratbench run SUITE`: verify, time and profile every strategy of a suite (harness/run), on
// threads or as one rank of a launched run. One subcommand per file (cli/commands.h).

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/numbers.h"
#include "harness/comm/c10d_backend.h"
#include "harness/dist/cost_profile.h"
#include "harness/error.h"
#include "harness/run/records.h"
#include "harness/run/run_util.h"
#include "harness/run/runner.h"
#include "harness/run/suite.h"

namespace {

using sb::cli::kExitBadInput;

struct RunArgs {
  std::string suitePath;
  sb::harness::RunOptions opts;
  int repetitions = 0, worldSize = 0;
  uint64_t seed = 0;
  double minTime = 0;
  double timeoutSec = 300;
  std::string rankFault;
  std::vector<std::string> plantFaults;
  std::vector<std::string> plantSlowdowns;
  std::vector<std::string> pluginPaths;
  std::vector<std::string> profilePaths;
};

// The suite's run, once the plugins are loaded; `run` is the parsed subcommand (which options
// were given).
int runSuite(RunArgs& a, const CLI::App& run) {
  auto& opts = a.opts;
  for (const auto& pf : a.plantFaults) {
    const auto eq = pf.rfind('=');  // ids contain "=", fault names do not
    if (eq == std::string::npos || eq == 0 || eq + 1 == pf.size()) {
      std::cerr << "stratbench: --plant-fault '" << pf << "': expected STRATEGY_ID=FAULT\n";
      return kExitBadInput;
    }
    // One fault a strategy: a second for the same id would be dropped (or refused with a
    // reason that is not the one).
    for (const auto& [id, fault] : opts.plantedFaults) {
      if (id == pf.substr(0, eq)) {
        std::cerr << "stratbench: --plant-fault '" << pf << "': strategy '" << id
                  << "' has a planted fault already ('" << fault
                  << "'): plant one fault per strategy a run\n";
        return kExitBadInput;
      }
    }
    opts.plantedFaults.emplace_back(pf.substr(0, eq), pf.substr(eq + 1));
  }
  for (const auto& ps : a.plantSlowdowns) {
    const auto eq = ps.rfind('=');  // ids contain "=", the percentage does not
    char* end = nullptr;
    const double pct = eq == std::string::npos ? 0 : std::strtod(ps.c_str() + eq + 1, &end);
    if (eq == std::string::npos || eq == 0 || eq + 1 == ps.size() || *end != '\0' ||
        !(pct > 0 && pct <= 1000)) {
      std::cerr << "stratbench: --plant-slowdown '" << ps
                << "': expected STRATEGY_ID=PERCENT with PERCENT in (0, 1000]\n";
      return kExitBadInput;
    }
    for (const auto& [id, given] : opts.plantedSlowdowns) {
      if (id == ps.substr(0, eq)) {
        std::cerr << "stratbench: --plant-slowdown '" << ps << "': strategy '" << id
                  << "' has a planted slowdown already (" << given * 100
                  << "%): give one per strategy\n";
        return kExitBadInput;
      }
    }
    opts.plantedSlowdowns.emplace_back(ps.substr(0, eq), pct / 100);
  }
  // --trace DIR: a folder, or a path where one can be made, before any row runs (a regular file
  // there made every row's trace fail on its own, the run going on without one).
  if (!opts.traceDir.empty()) {
    std::error_code ec;
    const auto st = std::filesystem::status(opts.traceDir, ec);
    if (std::filesystem::exists(st) && !std::filesystem::is_directory(st)) {
      std::cerr << "stratbench: --trace '" << opts.traceDir
                << "': not a folder (expected a folder for the traces, or a new path)\n";
      return kExitBadInput;
    }
    if (!std::filesystem::exists(st)) {
      const auto parent = std::filesystem::path(opts.traceDir).parent_path();
      if (!parent.empty() && !std::filesystem::is_directory(parent, ec)) {
        std::cerr << "stratbench: --trace '" << opts.traceDir << "': its folder " << parent.string()
                  << " is not a folder that exists\n";
        return kExitBadInput;
      }
    }
  }

  if (run.count("--repetitions")) opts.repetitions = a.repetitions;
  if (run.count("--seed")) opts.seed = a.seed;
  if (run.count("--min-time")) opts.minTimeSec = a.minTime;
  if (run.count("--world-size")) opts.worldSize = a.worldSize;
  opts.collectiveTimeout = std::chrono::milliseconds(static_cast<int64_t>(a.timeoutSec * 1000));
  try {
    if (!a.rankFault.empty()) opts.rankFault = sb::harness::parseRankFault(a.rankFault);
    for (size_t i = 0; i < a.profilePaths.size(); ++i) {
      opts.costProfiles.push_back(sb::harness::CostProfile::load(a.profilePaths[i]));
      opts.readFiles.emplace_back("--cost-profile", a.profilePaths[i]);
      // One profile per backend and mesh: of two, one would be used without a word (the times
      // predicted from whichever came first).
      const auto& p = opts.costProfiles.back();
      for (size_t j = 0; j < i; ++j) {
        const auto& q = opts.costProfiles[j];
        if (q.backend == p.backend && q.mesh == p.mesh) {
          throw sb::harness::InputError("--cost-profile " + a.profilePaths[j] + " and " +
                                        a.profilePaths[i] + " are both measured on backend " +
                                        p.backend + ", mesh " + p.mesh +
                                        ": give one profile per backend and mesh");
        }
      }
    }
    const auto suite = sb::harness::loadSuite(a.suitePath);
    const auto plan = sb::harness::planSuite(suite, opts);
    return sb::harness::runPlanned(suite, plan, opts, std::cout);
  } catch (const sb::harness::InputError& e) {
    std::cerr << "stratbench: " << sb::harness::errorText(e) << "\n";
    return kExitBadInput;
  } catch (const sb::harness::OutputBusy& e) {
    std::cerr << "stratbench: " << sb::harness::errorText(e) << "\n";
    return kExitBadInput;
  } catch (const c10::Error& e) {
    std::cerr << "stratbench: " << e.what_without_backtrace() << "\n";
    return kExitBadInput;
  } catch (const std::runtime_error& e) {
    // A multi-process run that could not start: the store or a rank unreachable.
    std::cerr << "stratbench: " << sb::harness::errorText(e) << "\n";
    return 1;
  }
}

}  // namespace

namespace sb::cli {

Command addRun(CLI::App& app) {
  const auto a = std::make_shared<RunArgs>();
  auto* run = app.add_subcommand("run", "Run a suite: verify, time and profile every strategy");
  run->add_option("suite", a->suitePath, "Suite file, e.g. suites/smoke.yaml")
      ->check(sb::cli::pathName())
      ->required();
  run->add_option("--filter", a->opts.filter, "Only strategy ids matching this regular expression")
      ->check(sb::cli::nonEmpty("a regular expression (leave --filter out to run every strategy)"));
  run->add_option("--case", a->opts.caseFilter,
                  "Only the cases whose names match this regular expression")
      ->check(sb::cli::nonEmpty("a regular expression (leave --case out to run every case)"));
  run->add_option("--backend", a->opts.backend,
                  "Communication backend: threads (one process), or gloo or nccl (a CUDA "
                  "LibTorch; one GPU per rank) under `stratbench launch`, torchrun, srun or "
                  "mpirun")
      ->check(CLI::IsMember(sb::harness::availableBackends()))
      ->capture_default_str();
  run->add_option("--timeout", a->timeoutSec,
                  "Seconds a rank may wait in a collective before the case fails")
      ->check(sb::cli::realNumber(0, 86400, true, "seconds"))
      ->capture_default_str();
  run->add_option(
      "--plant-rank-fault", a->rankFault,
      "Test only: KIND@RANK[@ROW] (throw, crash, hang) in that rank's ROW-th row (default 1)");
  run->add_option("--out", a->opts.outDir, "Output directory for results.csv and results.json")
      ->check(sb::cli::pathName())
      ->capture_default_str();
  run->add_option("--repetitions", a->repetitions, "Timing repetitions (overrides the suite)")
      ->check(sb::cli::wholeNumber(1, 100000, "repetitions"));
  run->add_option("--seed", a->seed, "Input seed (overrides the suite)")
      ->check(sb::cli::wholeNumber(0, std::numeric_limits<uint64_t>::max(), "seed"));
  run->add_option("--min-time", a->minTime, "Minimum seconds per repetition (overrides the suite)")
      ->check(sb::cli::realNumber(0, 3600, true, "seconds"));
  run->add_option("--world-size", a->worldSize, "Require every case's mesh to have N ranks")
      ->check(sb::cli::wholeNumber(1, 1024, "ranks"));

  run->add_option("--plant-fault", a->plantFaults,
                  "Test only: run strategy ID with a deliberate bug, as ID=FAULT (repeatable)");

  run->add_option("--plant-slowdown", a->plantSlowdowns,
                  "Test only: make strategy ID's timed steps PERCENT slower, as ID=PERCENT "
                  "(repeatable; the step spins that long after itself)");
  run->add_option("--plugin", a->pluginPaths, kPluginHelp)->check(sb::cli::pathName());
  run->add_flag("--write-golden", a->opts.writeGolden,
                "Write the training cases' per-step reference losses to the suite's golden file "
                "(its key 'golden') instead of comparing with it");
  run->add_option("--trace", a->opts.traceDir,
                  "Trace one more step of every row into DIR: per rank a Chrome trace-event file "
                  "(Perfetto) and a memory trace (reports/memory_snapshot.py)")
      ->check(sb::cli::pathName());
  run->add_flag("--capture", a->opts.capture,
                "Locate the first diverging node on every row that can (not only on failing "
                "ones): details.first_divergence");

  run->add_option("--cost-profile", a->profilePaths,
                  "Calibration profile(s) from `stratbench calibrate`: predicted times of the "
                  "cases on their backend and mesh come from it (repeatable)")
      ->check(sb::cli::pathName());
  return {run, [a, run] {
            if (!loadPluginsOrSay(a->pluginPaths)) return kExitBadInput;
            return runSuite(*a, *run);
          }};
}

}  // namespace sb::cli
