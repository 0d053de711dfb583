#include "harness/dist/launcher.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <thread>

#include "harness/comm/c10d_backend.h"

extern char** environ;

namespace sb::harness {
namespace {

using Clock = std::chrono::steady_clock;

volatile sig_atomic_t interrupted = 0;
void onSignal(int sig) { interrupted = sig; }

std::string describeStatus(int status) {
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return "was killed by signal " + std::to_string(sig) + " (" + strsignal(sig) + ")";
  }
  return "exited with code " + std::to_string(WEXITSTATUS(status));
}

struct Child {
  int rank = 0;
  pid_t pid = 0;
  bool done = false;
  int status = 0;
};

}  // namespace

int launch(const LaunchOptions& o, const std::string& self) {
  const int world = o.procsPerNode * o.nnodes;
  // The control store: served here on node 0, so it outlives any rank and the launcher can
  // mark dead ranks in it; other nodes connect to it.
  std::unique_ptr<ControlStore> store;
  try {
    store = std::make_unique<ControlStore>(o.masterAddr, o.masterPort, o.nodeRank == 0, o.timeout);
  } catch (const std::exception& e) {
    std::cerr << "stratbench launch: " << e.what() << "\n";
    return 1;
  }
  const int port = o.nodeRank == 0 ? store->port() : o.masterPort;

  // Each rank's environment, built before fork: only exec happens in the child.
  std::vector<std::string> inherited;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    const std::string k = kv.substr(0, kv.find('='));
    if (k == "RANK" || k == "WORLD_SIZE" || k == "LOCAL_RANK" || k == "LOCAL_WORLD_SIZE" ||
        k == "GROUP_RANK" || k == "MASTER_ADDR" || k == "MASTER_PORT" ||
        k == "STRATBENCH_AGENT_STORE") {
      continue;
    }
    inherited.push_back(kv);
  }
  // As torchrun does: ranks sharing the host share its cores.
  if (!std::getenv("OMP_NUM_THREADS")) {
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    inherited.push_back(
        "OMP_NUM_THREADS=" +
        std::to_string(std::max(1u, cores / static_cast<unsigned>(o.procsPerNode))));
  }

  struct sigaction sa {};
  sa.sa_handler = onSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  const pid_t launcherPid = getpid();
  std::vector<Child> children;
  for (int local = 0; local < o.procsPerNode; ++local) {
    // A signal while starting the ranks stops the starting: the watch loop below then stops
    // the ranks already started.
    if (interrupted) break;
    const int rank = o.nodeRank * o.procsPerNode + local;
    std::vector<std::string> env = inherited;
    env.push_back("RANK=" + std::to_string(rank));
    env.push_back("WORLD_SIZE=" + std::to_string(world));
    env.push_back("LOCAL_RANK=" + std::to_string(local));
    env.push_back("LOCAL_WORLD_SIZE=" + std::to_string(o.procsPerNode));
    env.push_back("GROUP_RANK=" + std::to_string(o.nodeRank));
    env.push_back("MASTER_ADDR=" + o.masterAddr);
    env.push_back("MASTER_PORT=" + std::to_string(port));
    env.push_back("STRATBENCH_AGENT_STORE=1");
    std::vector<char*> envp, argv;
    for (auto& kv : env) envp.push_back(kv.data());
    envp.push_back(nullptr);
    std::vector<std::string> args{self};
    args.insert(args.end(), o.command.begin(), o.command.end());
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t pid = fork();
    if (pid < 0) {
      std::cerr << "stratbench launch: fork failed: " << strerror(errno) << "\n";
      for (auto& c : children) kill(c.pid, SIGKILL);
      return 1;
    }
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != launcherPid) _exit(1);  // the launcher died before prctl
      signal(SIGINT, SIG_DFL);
      signal(SIGTERM, SIG_DFL);
      signal(SIGPIPE, SIG_DFL);
      execve(argv[0], argv.data(), envp.data());
      static const char msg[] = "stratbench launch: exec of the rank failed\n";
      (void)!write(2, msg, sizeof(msg) - 1);  // async-signal-safe, unlike iostreams
      _exit(127);
    }
    children.push_back({rank, pid});
  }

  // Watch the ranks.
  std::optional<Clock::time_point> killAt;
  std::string why;
  bool abnormal = false;
  bool killed = false;
  int forwarded = 0;
  for (;;) {
    int running = 0;
    for (auto& c : children) {
      if (c.done) continue;
      int status = 0;
      const pid_t r = waitpid(c.pid, &status, WNOHANG);
      if (r == 0) {
        ++running;
        continue;
      }
      c.done = true;
      c.status = status;
      const bool failed = WIFSIGNALED(status) || (c.rank != 0 && WEXITSTATUS(status) != 0);
      if (failed && !killed) {
        abnormal = true;
        const std::string how = describeStatus(status);
        std::cerr << "stratbench launch: rank " << c.rank << " (pid " << c.pid << ") " << how
                  << std::endl;
        try {
          store->set(deadRankKey(c.rank), how);
        } catch (const std::exception&) {
          // The store went with node 0; the other ranks find out through their timeouts.
        }
        const auto at = Clock::now() + o.timeout + o.grace;
        if (!killAt || at < *killAt) {
          killAt = at;
          why = "rank " + std::to_string(c.rank) + " " + how;
        }
      }
      if (c.rank == 0) {
        const auto at = Clock::now() + o.grace;
        if (!killAt || at < *killAt) {
          killAt = at;
          why = "rank 0 has finished";
        }
      }
    }
    if (running == 0) break;
    if (interrupted && forwarded != interrupted) {
      forwarded = interrupted;
      std::cerr << "stratbench launch: " << strsignal(interrupted) << ": stopping the ranks"
                << std::endl;
      for (auto& c : children) {
        if (!c.done) kill(c.pid, SIGTERM);
      }
      killAt = Clock::now() + std::chrono::seconds(2);
      why = "interrupted";
      abnormal = true;
    }
    if (killAt && Clock::now() >= *killAt) {
      for (auto& c : children) {
        if (c.done) continue;
        std::cerr << "stratbench launch: rank " << c.rank << " (pid " << c.pid
                  << ") still running after " << why << ": killing it" << std::endl;
        kill(c.pid, killed ? SIGKILL : SIGTERM);
      }
      // SIGTERM first; two seconds later, SIGKILL.
      killAt = Clock::now() + std::chrono::seconds(2);
      if (killed) killAt = Clock::now() + std::chrono::milliseconds(200);
      killed = true;
      abnormal = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (interrupted) return 128 + interrupted;
  int rc0 = 0;
  for (const auto& c : children) {
    if (c.rank == o.nodeRank * o.procsPerNode && c.rank == 0) {
      rc0 = WIFEXITED(c.status) ? WEXITSTATUS(c.status) : 1;
    }
  }
  if (abnormal && rc0 == 0) return 1;
  return rc0;
}

}  // namespace sb::harness
