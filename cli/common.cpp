// Helpers shared by the subcommands of stratbench-core (cli/common.h).

#include "cli/common.h"
#include "cli/numbers.h"

#include <unistd.h>

#include <chrono>
#include <iostream>

#include "harness/hidden_text.h"
#include "harness/plugin_loader.h"
#include "harness/run/run_util.h"
#include "reference/json_strict.h"

namespace sb::cli {

bool loadPluginsOrSay(const std::vector<std::string>& paths) {
  try {
    sb::harness::loadPlugins(paths);
  } catch (const sb::harness::PluginError& e) {
    std::cerr << "stratbench: " << sb::harness::errorText(e) << "\n";
    return false;
  }
  return true;
}

void addModelOptions(CLI::App* cmd, ModelOptions& m, const std::string& help) {
  CLI::Option* model = cmd->add_option("--model", m.file, help)->check(sb::cli::pathName());
  // A traced model is the graph: a built-in workload's --workload or --shape beside it would be
  // ignored, and --input or --params without it describe nothing. Refused at parsing (exit 2,
  // "--model excludes --workload", "--input requires --model").
  for (const char* name : {"--workload", "--shape"}) {
    if (CLI::Option* o = cmd->get_option_no_throw(name)) model->excludes(o);
  }
  cmd->add_option("--input", m.inputs,
                  "With --model, one per forward input: '[2, 16, 64]' (float) or "
                  "'{\"shape\": [2, 16], \"dtype\": \"int64\", \"low\": 0, \"high\": 64}'")
      ->allow_extra_args(false)  // one per --input: its JSON brackets are not a CLI list
      ->needs(model);
  cmd->add_option("--params", m.params, "With --model: module (default) or seed")->needs(model);
}

nlohmann::json modelShape(const ModelOptions& m) {
  if (m.inputs.empty()) {
    throw std::invalid_argument(
        "--model needs --input for each of the forward's inputs, e.g. "
        "--input '[2, 16, 64]' or --input '{\"shape\": [2, 16], "
        "\"dtype\": \"int64\", \"low\": 0, \"high\": 64}'");
  }
  nlohmann::json shape = {{"file", m.file}, {"inputs", nlohmann::json::array()}};
  for (const auto& text : m.inputs) {
    try {
      shape["inputs"].push_back(reference::parseJsonNoDuplicates(text));
    } catch (const nlohmann::json::exception& e) {
      throw std::invalid_argument("--input '" + sb::harness::shownValue(text) +
                                  "' is not valid JSON: " + sb::harness::errorText(e));
    }
  }
  if (!m.params.empty()) shape["params"] = m.params;
  return shape;
}

TtyProgress::TtyProgress(std::string what, std::string phase, double quietSeconds)
    : what_(std::move(what)), phase_(std::move(phase)), quiet_(quietSeconds) {
  if (::isatty(STDERR_FILENO)) thread_ = std::thread([this] { run(); });
}

TtyProgress::~TtyProgress() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    done_ = true;
  }
  wake_.notify_all();
  thread_.join();
  if (shown_) harness::clearTerminalLine();
}

void TtyProgress::phase(std::string phase) {
  std::lock_guard<std::mutex> lock(mutex_);
  phase_ = std::move(phase);
}

void TtyProgress::run() {
  const auto start = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mutex_);
  while (!wake_.wait_for(lock, std::chrono::seconds(1), [this] { return done_; })) {
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (s < quiet_) continue;
    harness::clearTerminalLine();
    std::cerr << "stratbench " << what_ << ": " << phase_ << ", " << static_cast<int>(s) << " s"
              << std::flush;
    shown_ = true;
  }
}

}  // namespace sb::cli
