#pragma once

// Loading plugins (harness/plugin.h) into the strategy registry. Internal to the CLI.

#include <stdexcept>
#include <string>
#include <vector>

namespace sb::harness {

// A plugin that was refused: the message names the file and what was expected.
class PluginError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct LoadedPlugin {
  std::string path;  // as given
  std::string name;  // from SB_PLUGIN
  std::vector<std::string> strategyIds;
};

// Loads one plugin: dlopen, check `stratbench_plugin`'s API and LibTorch versions, then add
// its strategies to the global registry (all or none). A file already loaded (the same file by
// another path included) is not loaded again and returns its first load. Throws PluginError.
LoadedPlugin loadPlugin(const std::string& path);

// The files STRATBENCH_PLUGIN_PATH names: entries separated by ':', each a plugin file or a
// folder whose `*.so` files are taken in name order. Empty entries are skipped; an entry that
// does not exist is a PluginError naming it.
std::vector<std::string> pluginPathsFromEnvironment();

// Every plugin of STRATBENCH_PLUGIN_PATH, then `explicitPaths` (--plugin) in order.
std::vector<LoadedPlugin> loadPlugins(const std::vector<std::string>& explicitPaths);

}  // namespace sb::harness
