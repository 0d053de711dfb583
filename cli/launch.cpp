// `stratbench launch`: starts the ranks of a multi-process run on this host
// (harness/dist/launcher.h). Not a CLI11 subcommand of the whole command line like the others:
// main.cpp hands it the command line as it is, since everything after "--" is the ranks' own.
// One subcommand per file (cli/commands.h).

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/numbers.h"
#include "harness/dist/dist_env.h"
#include "harness/dist/launcher.h"
#include "harness/run/run_util.h"

namespace sb::cli {

// `stratbench launch -n N [...] -- COMMAND...`: everything after "--" is the ranks' command.
int launchMain(int argc, char** argv) {
  sb::harness::LaunchOptions o;
  int split = argc;
  for (int i = 2; i < argc; ++i) {
    if (std::string(argv[i]) == "--") {
      split = i;
      break;
    }
  }
  CLI::App app{"stratbench launch: start N ranks of a multi-process run on this host"};
  app.name("stratbench launch");
  app.footer(
      std::string("The ranks' command follows \"--\" and is required: stratbench launch -n 4 "
                  "-- run SUITE --backend gloo --out DIR.\n") +
      sb::cli::kExitCodesText + " A rank lost, killed or hung: exit 1.\n");
  std::string hosts;
  double timeoutSec = 300, graceSec = 10;
  app.add_option("-n,--nproc-per-node", o.procsPerNode, "Ranks to start on this host")
      ->required()
      ->check(sb::cli::wholeNumber(1, 1024, "ranks"));
  auto* nnodes =
      app.add_option("--nnodes", o.nnodes, "Hosts taking part, each running its own launch")
          ->check(sb::cli::wholeNumber(1, 4096, "hosts"));
  app.add_option("--node-rank", o.nodeRank, "This host's place among them (0 serves the store)")
      ->check(sb::cli::wholeNumber(0, 4095, "hosts"));
  auto* masterAddr =
      app.add_option("--master-addr", o.masterAddr, "Address of node 0")->capture_default_str();
  app.add_option("--master-port", o.masterPort, "Port of node 0's store (0: any free port)")
      ->check(sb::cli::wholeNumber(0, 65535, "port"));
  // Given beside them, one would silently override the other.
  app.add_option("--hosts", hosts,
                 "Comma-separated hosts, node 0 first: sets --nnodes and --master-addr")
      ->check(sb::cli::nonEmpty("hosts, node 0 first"))
      ->excludes(nnodes)
      ->excludes(masterAddr);
  // At least a second: below it the store's own connect and serve calls time out before any
  // rank can reach it ("cannot serve the store on port 0" said nothing of the timeout).
  app.add_option("--timeout", timeoutSec,
                 "Seconds a rank may wait on the store, and the other ranks get (with --grace) "
                 "to finish after a rank dies (at least 1)")
      ->check(sb::cli::realNumber(1, 86400, false, "seconds"))
      ->capture_default_str();
  app.add_option("--grace", graceSec, "Seconds the ranks get after rank 0 has finished")
      ->check(sb::cli::realNumber(0, 86400, true, "seconds"))
      ->capture_default_str();
  std::vector<std::string> before;
  for (int i = split - 1; i >= 2; --i) before.push_back(argv[i]);  // CLI11 wants them reversed
  try {
    app.parse(before);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : kExitBadInput;
  }
  if (split + 1 >= argc) {
    std::cerr << "stratbench launch: nothing to run: expected `-- run SUITE ...` after the "
                 "options\n";
    return kExitBadInput;
  }
  for (int i = split + 1; i < argc; ++i) o.command.push_back(argv[i]);
  // The ranks of a world: `run` and `calibrate` are the commands that are one (every other one
  // would run once per rank: `launch -- launch` a world of worlds, `launch -- report` N reports
  // into one folder).
  if (o.command.front() != "run" && o.command.front() != "calibrate") {
    std::cerr << "stratbench launch: `" << sb::harness::shownValue(o.command.front(), 64)
              << "` is not a command whose processes form a world: launch starts the ranks of "
                 "`run` or `calibrate` (-- run SUITE ... or -- calibrate ...)\n";
    return kExitBadInput;
  }
  if (o.command.front() == "run") {
    // `threads` is one process's backend: under launch every rank would run the whole suite on
    // its own threads into the same folder (a race on the results). No backend given: gloo.
    std::string backend;
    for (size_t i = 1; i < o.command.size(); ++i) {
      const std::string& w = o.command[i];
      if (w == "--backend" && i + 1 < o.command.size()) backend = o.command[i + 1];
      if (w.rfind("--backend=", 0) == 0) backend = w.substr(10);
    }
    if (backend.empty()) {
      o.command.push_back("--backend");
      o.command.push_back("gloo");
      std::cerr << "stratbench launch: `run` without --backend: the ranks run on gloo (threads is "
                   "a single process's backend)\n";
    } else if (backend == "threads" && (o.procsPerNode > 1 || o.nnodes > 1)) {
      std::cerr << "stratbench launch: `run --backend threads` runs every rank of a mesh in one "
                   "process; under launch each of the "
                << o.procsPerNode
                << " processes would run the whole suite into the same folder. Use --backend "
                   "gloo (or nccl), or run without launch\n";
      return kExitBadInput;
    }
  }
  if (!hosts.empty()) {
    std::vector<std::string> list;
    std::stringstream ss(hosts);
    for (std::string h; std::getline(ss, h, ',');) {
      if (!h.empty()) list.push_back(h);
    }
    if (list.empty()) {
      std::cerr << "stratbench launch: --hosts '" << hosts << "' names no host\n";
      return kExitBadInput;
    }
    o.nnodes = static_cast<int>(list.size());
    o.masterAddr = list.front();
  }
  std::string why = sb::harness::hostProblem(o.masterAddr);
  // A name no resolver knows: every rank would retry it until the timeout.
  if (why.empty()) why = sb::harness::resolveProblem(o.masterAddr);
  if (!why.empty()) {
    std::cerr << "stratbench launch: " << (hosts.empty() ? "--master-addr" : "--hosts' first host")
              << " '" << o.masterAddr << "': " << why << "\n";
    return kExitBadInput;
  }
  {
    // Every rank is a process that loads LibTorch and runs its own threads: beyond a few per
    // core a host only thrashes (and a thousand forks take minutes to stop).
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    const int most = std::max(8, 8 * cores);
    if (o.procsPerNode > most) {
      std::cerr << "stratbench launch: -n " << o.procsPerNode << ": at most " << most
                << " ranks on this host (8 per CPU core, at least 8; it has " << cores
                << "): each rank is a process running LibTorch\n";
      return kExitBadInput;
    }
  }
  if (o.nodeRank >= o.nnodes) {
    std::cerr << "stratbench launch: --node-rank " << o.nodeRank << " is not below --nnodes "
              << o.nnodes << "\n";
    return kExitBadInput;
  }
  if (o.nnodes > 1 && o.masterPort == 0) {
    std::cerr << "stratbench launch: --nnodes " << o.nnodes
              << " needs --master-port: every host must know where node 0's store listens\n";
    return kExitBadInput;
  }
  o.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeoutSec * 1000));
  o.grace = std::chrono::milliseconds(static_cast<int64_t>(graceSec * 1000));
  char self[4096];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (len <= 0) {
    std::cerr << "stratbench launch: cannot find this executable (/proc/self/exe)\n";
    return 1;
  }
  self[len] = '\0';
  return sb::harness::launch(o, self);
}

}  // namespace sb::cli
