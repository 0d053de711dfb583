// The report's plots (report_internal.h): reports/plots/make_plots.py run on the staging
// folder as a subprocess (python3 + matplotlib), the only part of the report that leaves C++.

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "harness/parse_number.h"
#include "harness/run/run_util.h"
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

// STRATBENCH_PLOT_TIMEOUT_S: the seconds the plot scripts may take (600 by default; 1 to 86400).
// A value that is not one is said and the default used: a report is not refused for its plots.
int plotTimeoutSeconds() {
  constexpr int kDefault = 600;
  const char* v = std::getenv("STRATBENCH_PLOT_TIMEOUT_S");
  if (v == nullptr || *v == '\0') return kDefault;
  uint64_t n = 0;
  if (!harness::parseWholeNumber(v, 1, 86400, &n)) {
    std::cerr << "stratbench report: STRATBENCH_PLOT_TIMEOUT_S='" << v
              << "' is not a number of seconds from 1 to 86400; the plots get " << kDefault
              << " s\n";
    return kDefault;
  }
  return static_cast<int>(n);
}

}  // namespace

std::string runPlots(const std::string& dir) {
  const char* given = std::getenv("STRATBENCH_PYTHON");
  const std::string py = pythonInterpreter();
  const std::string script = plotsScript();
  if (!fs::is_regular_file(script)) return "plot scripts not found at " + script;
  std::vector<std::string> args = {py, script, dir};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  // The scripts' messages (a plot skipped and why) go to a file as well as to stderr, so that the
  // report says which plot is missing and why, not "see its messages above" in a document with
  // nothing above.
  char errPath[] = "/tmp/stratbench-plots-XXXXXX";
  const int errFd = ::mkstemp(errPath);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (errFd >= 0) posix_spawn_file_actions_adddup2(&actions, errFd, STDERR_FILENO);
  // In the report's own process group: a Ctrl-C or a `timeout` that stops the report stops the
  // interpreter with it (in a group of its own it ran on, orphaned).
  pid_t pid = 0;
  const int spawned = posix_spawnp(&pid, py.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  std::string messages;
  const auto collect = [&] {
    if (errFd < 0) return;
    std::ifstream in(errPath);
    messages.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    ::close(errFd);
    ::unlink(errPath);
    std::cerr << messages;
  };
  if (spawned != 0) {
    collect();
    if (given && *given) {
      return "cannot start STRATBENCH_PYTHON='" + py +
             "' (expected a Python interpreter with matplotlib)";
    }
    return "cannot start " + py + " (install python3-matplotlib, or set STRATBENCH_PYTHON)";
  }
  // A deadline: an interpreter that never returns (a matplotlib backend waiting on a display, a
  // wrapper script that hangs) held the report forever; past it the plots are missing, said so,
  // and the report is written.
  const int limit = plotTimeoutSeconds();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(limit);
  int status = 0;
  bool killed = false;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      killed = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  collect();
  if (killed) {
    return py + " " + script + " did not finish within " + std::to_string(limit) +
           " s (STRATBENCH_PLOT_TIMEOUT_S) and was stopped";
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    // Each plot the scripts skipped, with its reason (make_plots.py's "make_plots: ..." lines);
    // at most a few, each cut, so that a hostile results.json cannot fill the report with them.
    std::string why;
    std::istringstream lines(messages);
    int shown = 0, more = 0;
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind("make_plots: ", 0) != 0) continue;
      if (shown == 3) {
        ++more;
        continue;
      }
      why += (shown++ ? "; " : ": ") + harness::shownValue(line.substr(12), 400);
    }
    if (more) why += "; and " + std::to_string(more) + " more";
    return py + " " + script + " failed (exit " +
           std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1) + ")" +
           (why.empty() ? "; see its messages on stderr" : why);
  }
  if (!fs::exists(dir + "/plots/.make_plots.done")) {
    return py + " exited 0 without running " + script +
           " (it wrote no plots/.make_plots.done): STRATBENCH_PYTHON must name a Python with "
           "matplotlib";
  }
  return "";
}

}  // namespace sb::reports
