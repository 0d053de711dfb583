#pragma once

// What several subcommands of stratbench-core share (cli/commands.h): the exit code for bad
// input, and the plugins that `list` and `run` load.

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

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

// The shape of a torchscript case from `--model FILE --input SPEC ...` (each SPEC JSON: a list
// of dimensions, or {"shape": [...], "dtype": "int64", "low": 0, "high": 64}) and `--params`.
// Throws std::invalid_argument naming the option.
nlohmann::json modelShape(const std::string& file, const std::vector<std::string>& inputs,
                          const std::string& params);

}  // namespace sb::cli
