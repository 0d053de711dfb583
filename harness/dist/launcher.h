#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace sb::harness {

struct LaunchOptions {
  int procsPerNode = 1;  // -n
  int nnodes = 1;        // hosts taking part, each running its own launch
  int nodeRank = 0;      // this host's place among them
  std::string masterAddr = "127.0.0.1";
  int masterPort = 0;  // 0: a free port (one host only)
  // How long the other ranks get to finish (and rank 0 to write its record) after a rank dies;
  // after rank 0 exits, the rest get `grace`.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  std::chrono::milliseconds grace{std::chrono::seconds(10)};
  std::vector<std::string> command;  // stratbench arguments, e.g. {"run", "suites/smoke.yaml"}
};

// `stratbench launch`: starts procsPerNode ranks of this binary on this host with the rank
// environment torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK,
// MASTER_ADDR, MASTER_PORT), serves the control store on node 0, and watches the ranks: one
// that dies is reported (and marked in the store, so rank 0 can name it at once), the others
// get `timeout` to finish, and any rank still alive after that, or `grace` after rank 0 has
// exited, is killed (SIGTERM, then SIGKILL). Ranks die with the launcher (PR_SET_PDEATHSIG),
// so a launch never leaves processes behind. Returns rank 0's exit code, or 1 when any rank
// failed abnormally.
int launch(const LaunchOptions& options, const std::string& self);

}  // namespace sb::harness
