// The report's plots (report_internal.h): reports/plots/make_plots.py run on the staging
// folder as a subprocess (python3 + matplotlib), the only part of the report that leaves C++.

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "reports/report_internal.h"

extern char** environ;

namespace sb::reports {
namespace fs = std::filesystem;
namespace {

std::string pythonInterpreter() {
  if (const char* p = std::getenv("STRATBENCH_PYTHON"); p && *p) return p;
  // Debian's interpreter, which has Debian's matplotlib, even where another python3 (pyenv,
  // a virtualenv) comes first on PATH.
  if (::access("/usr/bin/python3", X_OK) == 0) return "/usr/bin/python3";
  return "python3";
}

std::string plotsScript() {
  if (const char* d = std::getenv("STRATBENCH_PLOTS_DIR"); d && *d) {
    return std::string(d) + "/make_plots.py";
  }
  // The checkout this was built from, else an installation's share/stratbench/plots beside
  // bin/ (cmake --install).
  const std::string checkout = std::string(SB_SOURCE_DIR) + "/reports/plots/make_plots.py";
  if (fs::is_regular_file(checkout)) return checkout;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path installed =
        exe.parent_path().parent_path() / "share/stratbench/plots/make_plots.py";
    if (fs::is_regular_file(installed)) return installed.string();
  }
  return checkout;
}

}  // namespace

std::string runPlots(const std::string& dir) {
  const std::string py = pythonInterpreter();
  const std::string script = plotsScript();
  if (!fs::is_regular_file(script)) return "plot scripts not found at " + script;
  std::vector<std::string> args = {py, script, dir};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (posix_spawnp(&pid, py.c_str(), nullptr, nullptr, argv.data(), environ) != 0) {
    return "cannot start " + py + " (install python3-matplotlib, or set STRATBENCH_PYTHON)";
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return py + " " + script + " failed (exit " +
           std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1) +
           "); see its messages above";
  }
  return "";
}

}  // namespace sb::reports
