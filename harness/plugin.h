#pragma once

// Plugins: strategies in a shared library of their own, loaded by `stratbench run --plugin
// libmine.so` (or STRATBENCH_PLUGIN_PATH) and verified, timed and profiled like the built-in
// ones. A plugin's executor files register their strategies with the same macro as the
// built-in ones (SB_REGISTER_STRATEGIES, harness/registry.h), and exactly one of its files
// says, with SB_PLUGIN, which plugin API it was compiled against:
//
//   #include "harness/plugin.h"
//   SB_PLUGIN("my_strategy");
//
// Loading runs the library's registrars but holds what they register: nothing of the plugin
// is called until the loader has read `stratbench_plugin` and checked that its API version
// and its LibTorch version are this stratbench's. A library refused (no such file, not a
// loadable library, no `stratbench_plugin` symbol, another API or LibTorch version, or a
// strategy id that is already registered) registers nothing, and the command exits with 2.
//
// Build a plugin against an installed stratbench with find_package(stratbench) and
// stratbench_add_plugin(NAME SOURCES...), or link a MODULE library to stratbench::harness.

#include <torch/version.h>

#include "harness/registry.h"

// The plugin API's version: the layout of everything in the installed headers that a plugin
// and stratbench share (Strategy, RankExecutor, CaseSpec, RankContext, Communicator, ...).
// It changes whenever one of them changes in a way that breaks a compiled plugin, and a plugin
// must have been compiled against exactly this version.
#define SB_PLUGIN_API_VERSION 9

extern "C" {
// What `stratbench_plugin()` returns. Its first field stays the API version in every version,
// so that the loader can read it from a plugin of any version.
struct sb_plugin_info {
  int api_version;             // SB_PLUGIN_API_VERSION the plugin was compiled with
  const char* name;            // the name given to SB_PLUGIN
  const char* torch_version;   // TORCH_VERSION it was compiled with
  const char* build_compiler;  // __VERSION__ of the compiler that built it, for messages
};
}

// Defines the plugin's `stratbench_plugin` symbol; once per plugin, at namespace scope.
#define SB_PLUGIN(plugin_name)                                                                  \
  extern "C" __attribute__((visibility("default"))) const sb_plugin_info* stratbench_plugin() { \
    static const sb_plugin_info info = {SB_PLUGIN_API_VERSION, plugin_name, TORCH_VERSION,      \
                                        __VERSION__};                                           \
    return &info;                                                                               \
  }                                                                                             \
  static_assert(true, "SB_PLUGIN takes a semicolon")
