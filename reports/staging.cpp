// Writing the report's folder safely (report_internal.h): the set is built whole in a staging
// folder beside it and moved in at once with signals held, so that an interrupted or failed
// report leaves the previous set, never a mix; stale staging folders of dead reports go.

#include <ftw.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <utility>

#include "harness/run/records.h"
#include "reports/report_internal.h"

namespace sb::reports {
namespace fs = std::filesystem;

void writeText(const std::string& path, const std::string& text) {
  harness::writeFileAtomic(path, text);
}

namespace {

constexpr const char* kStagingPrefix = ".report.new.";
// The list of the files the report in this folder wrote (one relative path a line), moved in
// with its set: the next report removes only files that list names (never a file of the
// user's, whatever its name) and checks every name it reads back.
constexpr const char* kManifest = ".stratbench-report";

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
  struct stat st = {}, staged = {};
  // The report's own sub-folders are its own: one that is a symbolic link (plots -> ~/Pictures)
  // is refused, never written through nor pruned; pipeline/ too when this set writes none there
  // (the previous set's files in it would be pruned through the link).
  for (const char* sub : {"/plots", "/pipeline"}) {
    const std::string d = dir + sub;
    if (::lstat(d.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
      std::error_code linkEc;
      const fs::path target = fs::read_symlink(d, linkEc);
      return d + " is a symbolic link" +
             (linkEc ? std::string() : " (to " + target.string() + ")") +
             ": the report writes its files into a folder of its own there and removes the "
             "ones it no longer writes; remove the link or give --out another folder";
    }
  }
  // A folder no report wrote (no manifest) holding a file of a name the set writes: the user's
  // (`report RUN --out .` over their own report.md or summary.csv), never replaced.
  if (::lstat((dir + "/" + kManifest).c_str(), &st) != 0) {
    for (const auto& f : files) {
      const std::string to = dir + "/" + f;
      if (::lstat(to.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) {
        return to + " is there and no report wrote it (" + dir + " has no " + kManifest +
               "): the report would replace it; give --out a folder of its own, or move it";
      }
    }
  }
  // A name the set moves in that is a folder now (gate.json made a folder): refused here, before
  // the first move, not after half the set has replaced the previous one.
  for (const auto& f : files) {
    const std::string to = dir + "/" + f;
    if (::lstat(to.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
      return to +
             " is a folder; the report's file of that name cannot replace it: remove it "
             "or give --out another folder";
    }
  }
  for (const auto& d : folders) fs::create_directories(d, ec);
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

// What the report in `dir` wrote, from its manifest: the names a report writes (plots/X.png,
// pipeline/X.json, history.csv; X of letters, digits, - _ . and not . or ..), any other line
// ignored. Empty where there is no manifest (a report older than it, or none).
std::set<std::string> previousSet(const std::string& dir) {
  std::set<std::string> out;
  std::ifstream in(dir + "/" + kManifest);
  std::string line;
  const auto plain = [](const std::string& name) {
    if (name.empty() || name == "." || name == ".." || name.size() > 255) return false;
    return std::all_of(name.begin(), name.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
    });
  };
  while (std::getline(in, line)) {
    if (line == "history.csv") {
      out.insert(line);
      continue;
    }
    for (const auto& [folder, ext] :
         {std::pair<std::string, std::string>{"plots/", ".png"}, {"pipeline/", ".json"}}) {
      const std::string name = line.substr(std::min(line.size(), folder.size()));
      if (line.rfind(folder, 0) == 0 && plain(name) && name.size() > ext.size() &&
          name.compare(name.size() - ext.size(), ext.size(), ext) == 0) {
        out.insert(line);
      }
    }
  }
  return out;
}

// The moves of commitSet, in order, stopping at the first that fails; the previous set's
// files that the new one does not have go only once every move succeeded. Returns the problem.
std::string moveSet(const std::string& stage, const std::string& dir,
                    const std::vector<std::string>& files) {
  // The previous set, read before its manifest is replaced by the new one.
  const std::set<std::string> previous = previousSet(dir);
  for (const auto& f : files) {
    const std::string to = dir + "/" + f;
    if (fs::is_directory(to)) return to + " is a folder; the report's file cannot replace it";
    if (std::rename((stage + "/" + f).c_str(), to.c_str()) != 0) {
      return "cannot move " + stage + "/" + f + " to " + to + ": " + std::strerror(errno);
    }
  }
  // The previous set's files that this one does not have: only those its manifest names.
  const std::set<std::string> keep(files.begin(), files.end());
  for (const std::string& old : previous) {
    if (keep.count(old)) continue;
    struct stat st = {};
    // Only inside a real sub-folder (checkDestinations refused links; checked again here, as
    // lstat looks at the last component only), and only a regular file.
    const size_t slash = old.find('/');
    if (slash != std::string::npos) {
      const std::string parent = dir + "/" + old.substr(0, slash);
      if (::lstat(parent.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) continue;
    }
    const std::string path = dir + "/" + old;
    if (::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) ::unlink(path.c_str());
  }
  return "";
}

}  // namespace

void commitSet(const std::string& stage, const std::string& dir,
               const std::vector<std::string>& set) {
  // The manifest moves in with the set, before report.html (the last).
  std::vector<std::string> files = set;
  std::string manifest;
  for (const auto& f : set) manifest += f + "\n";
  harness::writeFileAtomic(stage + "/" + kManifest, manifest);
  files.insert(files.end() - (files.empty() ? 0 : 1), kManifest);
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
