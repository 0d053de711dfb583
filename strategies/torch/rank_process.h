#pragma once

// A PyTorch rank runner (rank_runner.py) as a child process: its commands go to its stdin, one
// JSON object a line, its replies come back on file descriptor 3, one a line; its stdout and
// stderr go to a log file, whose tail is quoted when it fails.

#include <sys/types.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace sb::strategies::torchside {

class RankProcess {
 public:
  // Starts argv[0] (found on PATH where it has no '/') with `env` added to this process's
  // environment (replacing keys it has). Throws std::runtime_error saying what failed.
  RankProcess(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
              std::string logPath);
  // Asks it to exit, then kills it if it has not within a few seconds.
  ~RankProcess();
  RankProcess(const RankProcess&) = delete;
  RankProcess& operator=(const RankProcess&) = delete;

  // Sends `command` and waits up to `timeoutSec` for the reply. Throws std::runtime_error (the
  // log's tail quoted) where the process ends, closes its reply channel or does not answer, and
  // where `abandon` (asked about once a second while waiting) returns a reason: a peer rank
  // failed, so this one, blocked in a collective with it, will not answer.
  nlohmann::json call(const nlohmann::json& command, double timeoutSec,
                      const std::function<std::string()>& abandon = {});
  // The last `bytes` of its log.
  std::string logTail(size_t bytes = 2000) const;
  const std::string& logPath() const { return logPath_; }

 private:
  std::runtime_error failure(const std::string& what) const;

  pid_t pid_ = -1;
  int toChild_ = -1;
  int fromChild_ = -1;
  std::string pending_;
  std::string logPath_;
};

// The result of running a short command to its end: its exit status and what it printed.
struct CommandOutput {
  int status = -1;  // the exit code; -1 where it could not run or was killed
  std::string output;
};
// Runs argv (stdout and stderr together), killing it after `timeoutSec`.
CommandOutput runCommand(const std::vector<std::string>& argv, double timeoutSec);

}  // namespace sb::strategies::torchside
