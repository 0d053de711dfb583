// Replacing a result file safely (harness/out_file.h).

#include "harness/out_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>

#include "harness/error.h"

namespace sb::harness {
namespace {

// What a stat says is at a path, for the refusal.
std::string kindOf(mode_t mode) {
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// The file a symbolic link at `path` ends at (the path itself when it is none); an absent final
// component is kept, so that a link to a file not yet written is followed.
std::string resolveLinks(const std::string& path) {
  struct stat st = {};
  if (::lstat(path.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return path;
  std::unique_ptr<char, decltype(&std::free)> real(::realpath(path.c_str(), nullptr), &std::free);
  if (real) return real.get();
  const int err = errno;
  if (err == ELOOP) throw InputError(path + ": a loop of symbolic links, not a result file");
  // A dangling link: written as the link's target, which must then be in an existing folder.
  char target[PATH_MAX] = {};
  const ssize_t n = ::readlink(path.c_str(), target, sizeof target - 1);
  if (n <= 0) throw InputError(path + ": cannot read the symbolic link: " + std::strerror(err));
  std::string t(target, static_cast<size_t>(n));
  if (t.front() != '/') {
    const size_t slash = path.rfind('/');
    if (slash != std::string::npos) t = path.substr(0, slash + 1) + t;
  }
  return t;
}

}  // namespace

std::string checkResultPath(const std::string& path) {
  if (path.empty()) throw InputError("an empty path is not a result file");
  const std::string target = resolveLinks(path);
  struct stat st = {};
  if (::stat(target.c_str(), &st) == 0) {
    if (!S_ISREG(st.st_mode)) {
      throw InputError(path + (target == path ? "" : " (-> " + target + ")") + " is " +
                       kindOf(st.st_mode) +
                       "; only a regular file or a new path is replaced by a result file");
    }
    // A run's own results (`stratbench run` writes them, and nothing else may replace them):
    // `noise --out RUN/results.csv` destroyed one of the runs it had just read.
    const std::string name = target.substr(target.rfind('/') + 1);
    for (const char* kept :
         {"results.csv", "results.json", "results.partial.csv", "results.partial.json"}) {
      if (name == kept) {
        throw InputError(path + (target == path ? "" : " (-> " + target + ")") +
                         " holds a run's results (" + kept +
                         ", which `stratbench run` writes): replacing it would lose that run; "
                         "give another path");
      }
    }
  } else if (errno != ENOENT) {
    throw InputError(path + ": " + std::strerror(errno));
  } else {
    const size_t slash = target.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : target.substr(0, slash + 1);
    if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      throw InputError(path + ": the folder " + dir + " does not exist");
    }
  }
  return target;
}

std::string checkResultPath(const std::string& path, const InputFiles& inputs) {
  const std::string target = checkResultPath(path);
  struct stat out = {};
  if (::stat(target.c_str(), &out) != 0) return target;  // a new file is no input
  for (const auto& [option, input] : inputs) {
    struct stat in = {};
    if (input.empty() || ::stat(input.c_str(), &in) != 0) continue;
    if (in.st_dev == out.st_dev && in.st_ino == out.st_ino) {
      throw InputError(path + " is the file " + option + " names (" + input +
                       "): the result would replace what the command reads; give another path");
    }
  }
  return target;
}

void replaceResultFile(const std::string& path, const std::string& content,
                       const InputFiles& inputs) {
  const std::string target = checkResultPath(path, inputs);
  const std::string tmp = target + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    throw InputError("cannot write " + path + " (its temporary file " + tmp +
                     "): " + std::strerror(errno));
  }
  // Every failure below removes the temporary file before it throws.
  const auto failWith = [&](const std::string& what, int err) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw InputError(what + " " + path + ": " + std::strerror(err));
  };
  size_t done = 0;
  while (done < content.size()) {
    const ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) failWith("cannot write", errno);
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) failWith("cannot flush to disk", errno);
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw InputError("cannot write " + path + ": " + std::strerror(err));
  }
  if (std::rename(tmp.c_str(), target.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw InputError("cannot replace " + path + ": " + std::strerror(err));
  }
}

std::optional<InputAmongOutputs> inputAmongOutputs(const std::string& dir,
                                                   const std::set<std::string>& names,
                                                   const InputFiles& inputs) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path canonicalDir = fs::weakly_canonical(dir, ec);
  const auto isDir = [&](const fs::path& folder) {
    std::error_code same;
    if (fs::equivalent(folder, dir, same)) return true;
    std::error_code canon;
    const fs::path f = fs::weakly_canonical(folder, canon);
    return !canon && !ec && f == canonicalDir;
  };
  for (const auto& [option, path] : inputs) {
    if (path.empty() || path.size() > 4096) continue;
    std::error_code resolved;
    for (const fs::path& p : {fs::path(path), fs::weakly_canonical(path, resolved)}) {
      if (p.empty() || !names.count(p.filename().string())) continue;
      const fs::path parent = p.has_parent_path() ? p.parent_path() : fs::path(".");
      if (isDir(parent)) {
        return InputAmongOutputs{option, path, p.filename().string(),
                                 (parent / p.filename()).string()};
      }
    }
  }
  return std::nullopt;
}

}  // namespace sb::harness
