#include "harness/plugin_loader.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <sstream>

#include "harness/plugin.h"
#include "harness/registry.h"

namespace sb::harness {
namespace fs = std::filesystem;

namespace {

std::map<std::string, LoadedPlugin>& loadedByFile() {
  static std::map<std::string, LoadedPlugin> loaded;
  return loaded;
}

std::string dlMessage() {
  const char* e = dlerror();
  return e ? e : "unknown error";
}

}  // namespace

LoadedPlugin loadPlugin(const std::string& path) {
  const std::string where = "plugin '" + path + "'";
  std::error_code ec;
  const auto status = fs::status(path, ec);
  // A loop of symbolic links, or a folder that cannot be read, is not "no such file".
  if (ec && ec != std::errc::no_such_file_or_directory) {
    throw PluginError(where + ": " + ec.message());
  }
  if (!fs::exists(status)) throw PluginError(where + ": no such file");
  if (fs::is_directory(status)) {
    throw PluginError(where +
                      ": is a folder; expected a shared library (lib<name>.so); "
                      "STRATBENCH_PLUGIN_PATH takes folders");
  }
  // dlopen reads what it is given: a FIFO blocked it (and the command) forever.
  if (!fs::is_regular_file(status)) {
    throw PluginError(where +
                      ": not a regular file (a FIFO or a device); expected a shared "
                      "library (lib<name>.so)");
  }
  const std::string canonical = fs::canonical(path, ec).string();
  if (auto it = loadedByFile().find(canonical); it != loadedByFile().end()) return it->second;

  auto& registry = StrategyRegistry::global();
  registry.holdRegistrations();
  // Whatever refuses the plugin below, what its registrars queued is dropped, never made.
  struct DropUncommitted {
    StrategyRegistry& registry;
    ~DropUncommitted() {
      if (registry.holding()) registry.dropHeld();
    }
  } dropUncommitted{registry};
  // A path without a slash would make dlopen search the library path instead of this file.
  void* handle = dlopen(canonical.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    std::string why = dlMessage();
    std::string hint;
    if (why.find("undefined symbol") != std::string::npos) {
      hint =
          " (it needs a symbol this stratbench does not have: was it built against another "
          "stratbench or LibTorch? rebuild it against this installation)";
    } else if (why.find("invalid ELF header") != std::string::npos ||
               why.find("file too short") != std::string::npos) {
      hint = " (expected a shared library built with stratbench_add_plugin)";
    }
    throw PluginError("cannot load " + where + ": " + why + hint);
  }
  dlerror();
  using InfoFn = const sb_plugin_info* (*)();
  auto fn = reinterpret_cast<InfoFn>(dlsym(handle, "stratbench_plugin"));
  if (fn == nullptr) {
    throw PluginError(where +
                      " is not a stratbench plugin: it has no `stratbench_plugin` symbol "
                      "(one of its files must say SB_PLUGIN(\"name\"); see harness/plugin.h)");
  }
  const sb_plugin_info* info = fn();
  if (info == nullptr || info->api_version != SB_PLUGIN_API_VERSION) {
    std::ostringstream msg;
    msg << where << " was built against stratbench plugin API version "
        << (info ? std::to_string(info->api_version) : std::string("(none)"))
        << "; this stratbench has version " << SB_PLUGIN_API_VERSION
        << ": rebuild the plugin against this installation";
    throw PluginError(msg.str());
  }
  const std::string torchVersion = info->torch_version ? info->torch_version : "";
  if (torchVersion != TORCH_VERSION) {
    throw PluginError(where + " was built against LibTorch " + torchVersion +
                      "; this stratbench runs LibTorch " + TORCH_VERSION +
                      ": rebuild the plugin against this installation");
  }
  LoadedPlugin loaded;
  loaded.path = path;
  loaded.name = info->name ? info->name : "";
  try {
    loaded.strategyIds = registry.commitHeld(path);
  } catch (const std::exception& e) {
    throw PluginError(where + " refused: " + e.what());
  }
  loadedByFile()[canonical] = loaded;
  return loaded;
}

std::vector<std::string> pluginPathsFromEnvironment() {
  std::vector<std::string> out;
  const char* env = std::getenv("STRATBENCH_PLUGIN_PATH");
  if (env == nullptr) return out;
  std::stringstream ss(env);
  std::string entry;
  while (std::getline(ss, entry, ':')) {
    if (entry.empty()) continue;
    std::error_code ec;
    const auto status = fs::status(entry, ec);
    if (ec && ec != std::errc::no_such_file_or_directory) {
      throw PluginError("STRATBENCH_PLUGIN_PATH: '" + entry + "': " + ec.message());
    }
    if (fs::is_directory(status)) {
      // One level, every step with an error code: an entry that is a loop of symbolic links
      // or unreadable is skipped (it is no plugin file), never an uncaught filesystem_error.
      std::vector<std::string> files;
      fs::directory_iterator it(entry, ec), end;
      if (ec) throw PluginError("STRATBENCH_PLUGIN_PATH: '" + entry + "': " + ec.message());
      for (; it != end; it.increment(ec)) {
        if (ec) break;
        std::error_code fileEc;
        if (it->is_regular_file(fileEc) && it->path().extension() == ".so") {
          files.push_back(it->path());
        }
      }
      if (ec) throw PluginError("STRATBENCH_PLUGIN_PATH: '" + entry + "': " + ec.message());
      std::sort(files.begin(), files.end());
      out.insert(out.end(), files.begin(), files.end());
    } else if (fs::exists(status)) {
      out.push_back(entry);
    } else {
      throw PluginError("STRATBENCH_PLUGIN_PATH: '" + entry +
                        "' does not exist (expected plugin files or folders, separated by ':')");
    }
  }
  return out;
}

std::vector<LoadedPlugin> loadPlugins(const std::vector<std::string>& explicitPaths) {
  std::vector<std::string> paths = pluginPathsFromEnvironment();
  paths.insert(paths.end(), explicitPaths.begin(), explicitPaths.end());
  std::vector<LoadedPlugin> out;
  for (const auto& p : paths) out.push_back(loadPlugin(p));
  return out;
}

}  // namespace sb::harness
