#include "strategies/torch/rank_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <utility>

extern char** environ;

namespace sb::strategies::torchside {
namespace {

using Clock = std::chrono::steady_clock;

// Every descriptor made close-on-exec, so that a rank's pipes never leak into another rank's
// child (which would keep a dead child's reply channel open, hiding its end).
void makePipe(int fds[2]) {
  if (pipe2(fds, O_CLOEXEC) != 0) {
    throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  }
}

std::vector<std::string> environmentWith(const std::map<std::string, std::string>& add) {
  std::vector<std::string> out;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    const std::string key = kv.substr(0, kv.find('='));
    if (!add.count(key)) out.push_back(kv);
  }
  for (const auto& [k, v] : add) out.push_back(k + "=" + v);
  return out;
}

std::vector<char*> pointers(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (auto& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

pid_t spawn(std::vector<std::string> argv, std::vector<std::string> env,
            posix_spawn_file_actions_t* actions) {
  auto args = pointers(argv);
  auto envp = pointers(env);
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, args[0], actions, nullptr, args.data(), envp.data());
  if (rc != 0) {
    throw std::runtime_error("cannot start " + argv[0] + ": " + std::strerror(rc));
  }
  return pid;
}

// Waits for `pid` up to `seconds`, then kills it; its exit code, or -1 if killed or lost.
int reap(pid_t pid, double seconds) {
  const auto until = Clock::now() + std::chrono::duration<double>(seconds);
  int status = 0;
  while (true) {
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    if (r < 0) return -1;
    if (Clock::now() > until) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace

RankProcess::RankProcess(const std::vector<std::string>& argv,
                         const std::map<std::string, std::string>& env, std::string logPath)
    : logPath_(std::move(logPath)) {
  // A write to a runner that died must fail, not end this process.
  static const bool ignored = [] {
    signal(SIGPIPE, SIG_IGN);
    return true;
  }();
  (void)ignored;
  int in[2], reply[2];
  makePipe(in);
  makePipe(reply);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in[0], 0);
  posix_spawn_file_actions_adddup2(&actions, reply[1], 3);
  posix_spawn_file_actions_addopen(&actions, 1, logPath_.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  auto vars = env;
  vars["SB_REPLY_FD"] = "3";
  try {
    pid_ = spawn(argv, environmentWith(vars), &actions);
  } catch (...) {
    posix_spawn_file_actions_destroy(&actions);
    for (int fd : {in[0], in[1], reply[0], reply[1]}) close(fd);
    throw;
  }
  posix_spawn_file_actions_destroy(&actions);
  close(in[0]);
  close(reply[1]);
  toChild_ = in[1];
  fromChild_ = reply[0];
}

RankProcess::~RankProcess() {
  if (toChild_ >= 0) {
    const std::string bye = "{\"cmd\": \"exit\"}\n";
    // A child already gone: the write fails (SIGPIPE is ignored), harmlessly.
    [[maybe_unused]] const ssize_t n = write(toChild_, bye.data(), bye.size());
    close(toChild_);
  }
  if (fromChild_ >= 0) close(fromChild_);
  if (pid_ > 0) reap(pid_, 10.0);
}

std::string RankProcess::logTail(size_t bytes) const {
  std::ifstream in(logPath_);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string all = ss.str();
  return all.size() > bytes ? "..." + all.substr(all.size() - bytes) : all;
}

std::runtime_error RankProcess::failure(const std::string& what) const {
  const std::string tail = logTail();
  return std::runtime_error(what + (tail.empty() ? "" : "; the end of its log (" + logPath_ +
                                                            "):\n" + tail));
}

nlohmann::json RankProcess::call(const nlohmann::json& command, double timeoutSec,
                                 const std::function<std::string()>& abandon) {
  const std::string line = command.dump() + "\n";
  size_t sent = 0;
  while (sent < line.size()) {
    const ssize_t n = write(toChild_, line.data() + sent, line.size() - sent);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw failure("the PyTorch rank runner is gone (writing its command failed)");
    sent += static_cast<size_t>(n);
  }
  const auto until = Clock::now() + std::chrono::duration<double>(timeoutSec);
  while (pending_.find('\n') == std::string::npos) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
    if (left <= 0) {
      throw failure("the PyTorch rank runner did not answer '" + command.value("cmd", "") +
                    "' within " + std::to_string(static_cast<int>(timeoutSec)) +
                    " s (SB_TORCH_TIMEOUT_S)");
    }
    pollfd p{fromChild_, POLLIN, 0};
    const int rc = poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (rc < 0 && errno == EINTR) continue;
    if (rc == 0 && abandon) {
      const std::string why = abandon();
      if (!why.empty()) {
        throw std::runtime_error("the PyTorch rank runner was abandoned waiting for '" +
                                 command.value("cmd", "") + "': " + why);
      }
    }
    if (rc <= 0) continue;
    char buf[65536];
    const ssize_t n = read(fromChild_, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw failure("the PyTorch rank runner ended without answering");
    pending_.append(buf, static_cast<size_t>(n));
  }
  const size_t nl = pending_.find('\n');
  const std::string reply = pending_.substr(0, nl);
  pending_.erase(0, nl + 1);
  try {
    return nlohmann::json::parse(reply);
  } catch (const std::exception&) {
    throw failure("the PyTorch rank runner answered with what is not JSON: " + reply.substr(0, 200));
  }
}

CommandOutput runCommand(const std::vector<std::string>& argv, double timeoutSec) {
  int out[2];
  makePipe(out);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_adddup2(&actions, out[1], 2);
  CommandOutput result;
  pid_t pid = -1;
  try {
    pid = spawn(argv, environmentWith({}), &actions);
  } catch (const std::exception& e) {
    posix_spawn_file_actions_destroy(&actions);
    close(out[0]);
    close(out[1]);
    result.output = e.what();
    return result;
  }
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);
  const auto until = Clock::now() + std::chrono::duration<double>(timeoutSec);
  while (true) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
    if (left <= 0) break;
    pollfd p{out[0], POLLIN, 0};
    const int rc = poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0) continue;
    char buf[4096];
    const ssize_t n = read(out[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    result.output.append(buf, static_cast<size_t>(n));
  }
  close(out[0]);
  result.status = reap(pid, Clock::now() < until ? 5.0 : 0.0);
  return result;
}

}  // namespace sb::strategies::torchside
