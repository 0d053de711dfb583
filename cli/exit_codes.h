#pragma once

// The exit codes, as every command's --help ends with them (docs/cli.md): shared by
// stratbench-core's commands and the front's (cli/front.cpp), which links no LibTorch.

namespace sb::cli {

constexpr const char* kExitCodesText =
    "Exit codes: 0 everything passed (run), the gate passed (report), a plan or schedule was "
    "found (solve), or the command did what was asked; 1 a row failed or errored (run), the gate "
    "failed (report --gate), or no plan fits (solve); 2 bad input or usage, the message naming "
    "the file, line, key or value.";

}  // namespace sb::cli
