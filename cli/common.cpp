// Helpers shared by the subcommands of stratbench-core (cli/common.h).

#include "cli/common.h"

#include <iostream>

#include "harness/json_strict.h"
#include "harness/plugin_loader.h"

namespace sb::cli {

bool loadPluginsOrSay(const std::vector<std::string>& paths) {
  try {
    sb::harness::loadPlugins(paths);
  } catch (const sb::harness::PluginError& e) {
    std::cerr << "stratbench: " << e.what() << "\n";
    return false;
  }
  return true;
}

void addModelOptions(CLI::App* cmd, ModelOptions& m, const std::string& help) {
  cmd->add_option("--model", m.file, help);
  cmd->add_option("--input", m.inputs,
                  "With --model, one per forward input: '[2, 16, 64]' (float) or "
                  "'{\"shape\": [2, 16], \"dtype\": \"int64\", \"low\": 0, \"high\": 64}'")
      ->allow_extra_args(false);  // one per --input: its JSON brackets are not a CLI list
  cmd->add_option("--params", m.params, "With --model: module (default) or seed");
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
      shape["inputs"].push_back(harness::parseJsonNoDuplicates(text));
    } catch (const nlohmann::json::exception& e) {
      throw std::invalid_argument("--input '" + text + "' is not valid JSON: " + e.what());
    }
  }
  if (!m.params.empty()) shape["params"] = m.params;
  return shape;
}

}  // namespace sb::cli
