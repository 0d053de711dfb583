// Writing the report's folder safely (report_internal.h): the set is built whole in a staging
// folder beside it and moved in at once with signals held, so that an interrupted or failed
// report leaves the previous set, never a mix; stale staging folders of dead reports go.

#include <ftw.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>

#include "harness/run/records.h"
#include "reports/report_internal.h"

namespace sb::reports {
namespace fs = std::filesystem;

void writeText(const std::string& path, const std::string& text) {
  harness::writeFileAtomic(path, text);
}

namespace {

constexpr const char* kStagingPrefix = ".report.new.";

}  // namespace

void removeTree(const std::string& path) {
  ::nftw(
      path.c_str(),
      [](const char* p, const struct stat*, int, struct FTW*) {
        std::remove(p);
        return 0;
      },
      16, FTW_DEPTH | FTW_PHYS);
}

namespace {

// This host's name, as staging folders carry it.
std::string hostName() {
  char host[256] = {0};
  if (::gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') return "host";
  return host;
}

}  // namespace

std::string stagingName() {
  return std::string(kStagingPrefix) + hostName() + "." + std::to_string(::getpid());
}

void removeStaleStaging(const std::string& dir) {
  std::error_code ec;
  const std::string mine = std::string(kStagingPrefix) + hostName() + ".";
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(mine, 0) != 0) continue;
    const std::string pidText = name.substr(mine.size());
    char* end = nullptr;
    const long pid = std::strtol(pidText.c_str(), &end, 10);
    if (end == pidText.c_str() || *end != '\0' || pid <= 0) continue;
    if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) removeTree(e.path().string());
  }
}

namespace {

// Whether the staged set can be moved in: every destination folder a writable folder on the
// staging folder's file system (a rename cannot cross one), no destination a folder. Checked
// before anything is moved, so that a set is moved whole or not at all. Returns the problem.
std::string checkDestinations(const std::string& stage, const std::string& dir,
                              const std::vector<std::string>& files) {
  std::error_code ec;
  std::vector<std::string> folders = {dir, dir + "/plots"};
  // pipeline/: the pipeline rows' timelines and traces, where the set has any.
  for (const auto& f : files) {
    if (f.rfind("pipeline/", 0) == 0) {
      folders.push_back(dir + "/pipeline");
      break;
    }
  }
  for (const auto& d : folders) fs::create_directories(d, ec);
  struct stat st = {}, staged = {};
  for (const std::string& d : folders) {
    if (::stat(d.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      return d + " is not a folder the report can be written to";
    }
    if (::access(d.c_str(), W_OK) != 0) return d + ": " + std::strerror(errno);
    if (::stat(stage.c_str(), &staged) == 0 && staged.st_dev != st.st_dev) {
      return d + " is on another file system than " + stage +
             " (a symbolic link?): the report's files cannot be moved into it whole";
    }
  }
  return "";
}

// The moves of commitSet, in order, stopping at the first that fails; the previous set's
// files that the new one does not have go only once every move succeeded. Returns the problem.
std::string moveSet(const std::string& stage, const std::string& dir,
                    const std::vector<std::string>& files) {
  for (const auto& f : files) {
    const std::string to = dir + "/" + f;
    if (fs::is_directory(to)) return to + " is a folder; the report's file cannot replace it";
    if (std::rename((stage + "/" + f).c_str(), to.c_str()) != 0) {
      return "cannot move " + stage + "/" + f + " to " + to + ": " + std::strerror(errno);
    }
  }
  std::error_code ec;
  const std::set<std::string> keep(files.begin(), files.end());
  for (const auto& e : fs::directory_iterator(dir + "/plots", ec)) {
    if (e.path().extension() == ".png" && !keep.count("plots/" + e.path().filename().string())) {
      fs::remove(e.path(), ec);
    }
  }
  // The pipeline rows' timelines and traces (report.cpp).
  for (const auto& e : fs::directory_iterator(dir + "/pipeline", ec)) {
    if (e.path().extension() == ".json" &&
        !keep.count("pipeline/" + e.path().filename().string())) {
      fs::remove(e.path(), ec);
    }
  }
  if (!keep.count("history.csv")) fs::remove(dir + "/history.csv", ec);
  return "";
}

}  // namespace

void commitSet(const std::string& stage, const std::string& dir,
               const std::vector<std::string>& files) {
  if (const std::string problem = checkDestinations(stage, dir, files); !problem.empty()) {
    throw ReportInputError(problem);
  }
  std::string problem;
  {
    const harness::SignalHold hold;
    problem = moveSet(stage, dir, files);
  }
  if (!problem.empty()) throw std::runtime_error(problem);
}

}  // namespace sb::reports
