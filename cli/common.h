#pragma once

// What several subcommands of stratbench-core share (cli/commands.h): the exit code for bad
// input, and the plugins that `list` and `run` load.

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/exit_codes.h"

namespace sb::cli {

// Bad input or usage, a plugin refused included (the exit codes: cli/main.cpp).
constexpr int kExitBadInput = 2;

// The help of --plugin, the same for `list` and `run`.
constexpr const char* kPluginHelp =
    "Load strategies from this shared library (repeatable; STRATBENCH_PLUGIN_PATH adds more, "
    "':'-separated files or folders)";

// Loads the plugins of --plugin (`paths`) and of STRATBENCH_PLUGIN_PATH (harness/plugin_loader.h).
// False, having said why on stderr, when one is refused: the command then exits kExitBadInput.
bool loadPluginsOrSay(const std::vector<std::string>& paths);

// A traced model named on the command line instead of a graph workload (`graph`, `solve
// shard`): --model FILE, one --input SPEC per forward argument (JSON: a list of dimensions,
// or {"shape": [...], "dtype": "int64", "low": 0, "high": 64}), --params module|seed.
struct ModelOptions {
  std::string file, params;
  std::vector<std::string> inputs;
};
// Adds --model (`help` says what it does instead), --input and --params to `cmd`.
void addModelOptions(CLI::App* cmd, ModelOptions& m, const std::string& help);
// The shape of the torchscript case they name. Throws std::invalid_argument naming the option.
nlohmann::json modelShape(const ModelOptions& m);

// Progress of a long command on a terminal: while it lives, and once `quietSeconds` have passed,
// rewrites one stderr line each second, "stratbench WHAT: PHASE, N s"; the line is cleared when
// it ends. Nothing where stderr is not a terminal (scripts, CI logs).
class TtyProgress {
 public:
  TtyProgress(std::string what, std::string phase, double quietSeconds = 2);
  ~TtyProgress();
  TtyProgress(const TtyProgress&) = delete;
  TtyProgress& operator=(const TtyProgress&) = delete;
  void phase(std::string phase);

 private:
  void run();
  std::string what_, phase_;
  double quiet_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool done_ = false, shown_ = false;
  std::thread thread_;
};

}  // namespace sb::cli
