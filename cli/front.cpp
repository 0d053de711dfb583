// The `stratbench` command: a front that starts in milliseconds.
//
// LibTorch takes about a second to load (its shared libraries' relocations), which a command
// that reads a JSON chain and prints a schedule has no use for. So `solve checkpoint` and
// `solve pipeline` run here, in a program linked without LibTorch; every other command runs in
// `stratbench-core` (harness/cli/main.cpp), the full harness, found beside this program, which this
// process becomes (execv, the same arguments), so that exit codes, signals and output are its own.

#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <iostream>
#include <string>

#include "cli/serve.h"
#include "cli/solve_checkpoint.h"
#include "cli/solve_pipeline.h"
#include "cli/terminal_safe.h"

int main(int argc, char** argv) {
  sb::cli::installTerminalSafeOutput();
  if (!sb::cli::argumentsAreUtf8(argc, argv)) return 2;
  if (argc >= 3 && std::string(argv[1]) == "solve" && std::string(argv[2]) == "checkpoint") {
    return sb::cli::solveCheckpointMain(argc, argv);
  }
  if (argc >= 3 && std::string(argv[1]) == "solve" && std::string(argv[2]) == "pipeline") {
    return sb::cli::solvePipelineMain(argc, argv);
  }
  // The test scripts' fork server, where one is named (cli/serve.h).
  if (int rc = 0; sb::cli::runServed(argc, argv, &rc)) return rc;
  char self[PATH_MAX];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (len <= 0) {
    std::cerr << "stratbench: cannot find this executable (/proc/self/exe): "
              << std::strerror(errno) << "\n";
    return 2;
  }
  self[len] = '\0';
  std::string core(self);
  core = core.substr(0, core.rfind('/') + 1) + "stratbench-core";
  execv(core.c_str(), argv);
  std::cerr << "stratbench: cannot run " << core << ": " << std::strerror(errno) << "\n";
  return 2;
}
