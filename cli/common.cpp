// Helpers shared by the subcommands of stratbench-core (cli/common.h).

#include "cli/common.h"

#include <iostream>

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

}  // namespace sb::cli
