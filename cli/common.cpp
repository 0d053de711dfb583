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

nlohmann::json modelShape(const std::string& file, const std::vector<std::string>& inputs,
                          const std::string& params) {
  if (inputs.empty()) {
    throw std::invalid_argument(
        "--model needs --input for each of the forward's inputs, e.g. "
        "--input '[2, 16, 64]' or --input '{\"shape\": [2, 16], "
        "\"dtype\": \"int64\", \"low\": 0, \"high\": 64}'");
  }
  nlohmann::json shape = {{"file", file}, {"inputs", nlohmann::json::array()}};
  for (const auto& text : inputs) {
    try {
      shape["inputs"].push_back(harness::parseJsonNoDuplicates(text));
    } catch (const nlohmann::json::exception& e) {
      throw std::invalid_argument("--input '" + text + "' is not valid JSON: " + e.what());
    }
  }
  if (!params.empty()) shape["params"] = params;
  return shape;
}

}  // namespace sb::cli
