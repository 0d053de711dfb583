// The fork server of stratbench-core and its client in the front (see serve.h). No LibTorch
// here: the front links this file too.
//
// The exchange, over a Unix stream socket: the front sends a header (magic, payload size, count
// of descriptors) with the descriptors an exec would pass on (SCM_RIGHTS), then the payload:
// strings, each a 32-bit length and its bytes: the fingerprint, the working directory, the
// umask, the signals ignored and blocked, the descriptors' numbers, argc, the arguments, the
// environment. The server answers with a 32-bit pid (0: declined, the socket then closes), and
// when that process has ended, its 32-bit wait status.

#include "cli/serve.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

extern char** environ;

namespace sb::cli {
namespace {

constexpr uint32_t kMagic = 0x53424631;  // "SBF1"
constexpr uint32_t kMaxPayload = 64u << 20;
constexpr uint32_t kMaxFds = 250;  // SCM_RIGHTS carries at most 253

// What a forked process inherits from the server rather than from the front, as text: equal
// on both sides, or the command is not served.
std::string fingerprint() {
  static const char* const kLoadTime[] = {"OMP_",   "GOMP_",  "KMP_",    "MKL_",    "OPENBLAS_",
                                          "GOTO",   "LD_",    "MALLOC_", "GLIBC_",  "TORCH_",
                                          "PYTORCH_", "ATEN_", "DNNL_",  "ONEDNN_", "CAFFE2_",
                                          "CUDA_",  "NCCL_",  "LC_",     "LANG"};
  std::vector<std::string> vars;
  for (char** e = environ; e && *e; ++e) {
    for (const char* p : kLoadTime) {
      if (std::strncmp(*e, p, std::strlen(p)) == 0) {
        vars.emplace_back(*e);
        break;
      }
    }
  }
  std::sort(vars.begin(), vars.end());
  std::string f;
  for (const auto& v : vars) f += v + '\n';
  for (const char* ns : {"/proc/self/ns/net", "/proc/self/ns/mnt", "/proc/self/ns/pid"}) {
    char buf[128] = {};
    const ssize_t n = readlink(ns, buf, sizeof buf - 1);
    f += std::string(ns) + "=" + (n > 0 ? std::string(buf, static_cast<size_t>(n)) : "?") + '\n';
  }
  f += "uid=" + std::to_string(getuid()) + " gid=" + std::to_string(getgid()) +
       " euid=" + std::to_string(geteuid()) + " egid=" + std::to_string(getegid()) + " groups=";
  gid_t groups[256];
  const int ng = getgroups(256, groups);
  for (int i = 0; i < ng; ++i) f += std::to_string(groups[i]) + ",";
  f += '\n';
  // The CPUs it may run on: OpenMP sizes its threads by them when it loads.
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  f += "cpus=";
  if (sched_getaffinity(0, sizeof cpus, &cpus) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &cpus)) f += std::to_string(c) + ",";
    }
  }
  f += " nice=" + std::to_string(getpriority(PRIO_PROCESS, 0)) + '\n';
  for (int r : {RLIMIT_AS, RLIMIT_DATA, RLIMIT_STACK, RLIMIT_NOFILE, RLIMIT_CPU, RLIMIT_FSIZE,
                RLIMIT_CORE, RLIMIT_NPROC, RLIMIT_MEMLOCK}) {
    struct rlimit l = {};
    getrlimit(r, &l);
    f += std::to_string(r) + ":" + std::to_string(l.rlim_cur) + "/" + std::to_string(l.rlim_max) +
         '\n';
  }
  return f;
}

bool writeAll(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool readAll(int fd, void* data, size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = ::read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

void put(std::string& out, const std::string& s) {
  const uint32_t n = static_cast<uint32_t>(s.size());
  out.append(reinterpret_cast<const char*>(&n), sizeof n);
  out += s;
}

bool take(const std::string& in, size_t& at, std::string& s) {
  uint32_t n = 0;
  if (in.size() - at < sizeof n) return false;
  std::memcpy(&n, in.data() + at, sizeof n);
  at += sizeof n;
  if (in.size() - at < n) return false;
  s.assign(in, at, n);
  at += n;
  return true;
}

int pidfdOpen(pid_t pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
#else
  (void)pid;
  errno = ENOSYS;
  return -1;
#endif
}

// This process's open descriptors, but the one listing them.
std::vector<int> openDescriptors() {
  std::vector<int> fds;
  if (DIR* d = opendir("/proc/self/fd")) {
    const int own = dirfd(d);
    while (struct dirent* e = readdir(d)) {
      const int fd = std::atoi(e->d_name);
      if (e->d_name[0] != '.' && fd != own) fds.push_back(fd);
    }
    closedir(d);
  }
  return fds;
}

// One connection, in a process of its own: reads the command, forks the process that runs it,
// answers with its pid and, when it ends, its status. The front gone, the command is killed.
int session(int conn, const std::string& ours, int (*coreMain)(int, char**)) {
  signal(SIGCHLD, SIG_DFL);
  uint32_t header[3] = {};
  std::vector<int> fds;
  {
    struct iovec iov = {header, sizeof header};
    alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)];
    struct msghdr msg = {};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    ssize_t r;
    do {
      r = ::recvmsg(conn, &msg, MSG_CMSG_CLOEXEC | MSG_WAITALL);
    } while (r < 0 && errno == EINTR);
    struct cmsghdr* c = r > 0 ? CMSG_FIRSTHDR(&msg) : nullptr;
    if (c && c->cmsg_type == SCM_RIGHTS && c->cmsg_len >= CMSG_LEN(0)) {
      fds.resize((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
      std::memcpy(fds.data(), CMSG_DATA(c), fds.size() * sizeof(int));
    }
    if (r != static_cast<ssize_t>(sizeof header) || header[0] != kMagic ||
        header[1] > kMaxPayload || header[2] != fds.size() || (msg.msg_flags & MSG_CTRUNC)) {
      return 1;
    }
  }
  std::string payload(header[1], '\0');
  if (!readAll(conn, payload.data(), payload.size())) return 1;
  size_t at = 0;
  std::string theirs, cwd, mask, ignored, blocked, numbers, count;
  if (!take(payload, at, theirs) || !take(payload, at, cwd) || !take(payload, at, mask) ||
      !take(payload, at, ignored) || !take(payload, at, blocked) || !take(payload, at, numbers) ||
      !take(payload, at, count) || ignored.size() != NSIG || blocked.size() != NSIG) {
    return 1;
  }
  // The number each descriptor had in the front, in the order they came.
  std::vector<int> targets;
  for (const char* p = numbers.c_str(); *p;) {
    char* end = nullptr;
    targets.push_back(static_cast<int>(std::strtol(p, &end, 10)));
    if (end == p) return 1;
    p = *end == ',' ? end + 1 : end;
  }
  if (targets.size() != fds.size()) return 1;
  const int32_t declined = 0;
  if (theirs != ours) return writeAll(conn, &declined, sizeof declined) ? 0 : 1;
  const long argc = std::strtol(count.c_str(), nullptr, 10);
  if (argc < 1 || argc > 100000) return 1;
  std::vector<std::string> args(static_cast<size_t>(argc)), env;
  for (auto& a : args) {
    if (!take(payload, at, a)) return 1;
  }
  for (std::string e; at < payload.size();) {
    if (!take(payload, at, e)) return 1;
    env.push_back(e);
  }

  const pid_t session = getpid();
  const pid_t child = fork();
  if (child < 0) return writeAll(conn, &declined, sizeof declined) ? 0 : 1;
  if (child == 0) {
    // As a process stratbench-core's main starts in after exec: the front's descriptors,
    // directory, umask and environment; default signal handling; nothing else of the server's.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != session) _exit(137);
    // Signals: those the front ignored stay ignored and those it blocked blocked, as exec
    // keeps them; every other one default.
    sigset_t theirMask;
    sigemptyset(&theirMask);
    for (int s = 1; s < NSIG; ++s) {
      if (s == SIGKILL || s == SIGSTOP) continue;
      signal(s, ignored[static_cast<size_t>(s)] == '1' ? SIG_IGN : SIG_DFL);
      if (blocked[static_cast<size_t>(s)] == '1') sigaddset(&theirMask, s);
    }
    sigprocmask(SIG_SETMASK, &theirMask, nullptr);
    // The front's descriptors at the numbers they had there, and no other: first above every
    // such number (so that no dup2 overwrites another), then every other descriptor closed
    // (the server's, the connection), then each in its place.
    const int above = std::max(3, *std::max_element(targets.begin(), targets.end()) + 1);
    for (int& fd : fds) {
      const int moved = fcntl(fd, F_DUPFD_CLOEXEC, above);
      if (moved < 0) _exit(2);
      close(fd);
      fd = moved;
    }
    for (int fd : openDescriptors()) {
      if (std::find(fds.begin(), fds.end(), fd) == fds.end()) close(fd);
    }
    for (size_t i = 0; i < fds.size(); ++i) {
      if (dup2(fds[i], targets[i]) < 0) _exit(2);
      close(fds[i]);
    }
    umask(static_cast<mode_t>(std::strtol(mask.c_str(), nullptr, 8)));
    if (chdir(cwd.c_str()) != 0) {
      std::fprintf(stderr, "stratbench: cannot enter the working directory %s: %s\n",
                   cwd.c_str(), std::strerror(errno));
      _exit(2);
    }
    clearenv();
    for (const auto& e : env) putenv(strdup(e.c_str()));  // kept for the process's life
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(strdup(a.c_str()));
    argv.push_back(nullptr);
    std::exit(coreMain(static_cast<int>(args.size()), argv.data()));
  }
  for (int fd : fds) close(fd);
  const int32_t pid = child;
  if (!writeAll(conn, &pid, sizeof pid)) {
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
    return 1;
  }
  const int pidfd = pidfdOpen(child);
  for (;;) {
    struct pollfd p[2] = {{conn, POLLIN, 0}, {pidfd, POLLIN, 0}};
    const int n = poll(p, pidfd >= 0 ? 2 : 1, pidfd >= 0 ? -1 : 10);
    if (n < 0 && errno != EINTR) break;
    if (n > 0 && p[0].revents) {
      // The front sends nothing more: readable means it is gone (killed); so is its command.
      kill(child, SIGKILL);
      waitpid(child, nullptr, 0);
      return 0;
    }
    int status = 0;
    const pid_t w = waitpid(child, &status, WNOHANG);
    if (w == child) {
      const int32_t st = status;
      writeAll(conn, &st, sizeof st);
      return 0;
    }
    if (w < 0 && errno != EINTR) break;
  }
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  return 1;
}

volatile sig_atomic_t gServedPid = 0;

void forward(int sig) {
  const int saved = errno;
  if (gServedPid > 0) kill(static_cast<pid_t>(gServedPid), sig);
  errno = saved;
}

constexpr int kForwarded[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM};

// The descriptors an exec would pass on: open, without close-on-exec (a `<(...)` argument's
// /dev/fd/63 among them; a closed standard descriptor is not, and stays closed). Empty where
// they cannot be listed.
std::vector<int> inherited() {
  std::vector<int> fds;
  for (int fd : openDescriptors()) {
    const int flags = fcntl(fd, F_GETFD);
    if (flags >= 0 && !(flags & FD_CLOEXEC)) fds.push_back(fd);
  }
  std::sort(fds.begin(), fds.end());
  return fds;
}

}  // namespace

int serveForks(const char* path, pid_t parent, int (*coreMain)(int, char**)) {
  // A fork copies only the calling thread: a thread of the libraries' own would be missing (and
  // its locks held) in every command.
  int threads = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (struct dirent* e = readdir(d)) threads += e->d_name[0] != '.';
    closedir(d);
  }
  if (threads != 1) {
    std::fprintf(stderr, "stratbench-core __serve: %d threads after loading (a fork server needs 1)\n",
                 threads);
    return 2;
  }
  // With the script that started it (it may have gone while LibTorch loaded).
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (getppid() != parent) return 0;
  struct sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  if (std::strlen(path) >= sizeof addr.sun_path) {
    std::fprintf(stderr, "stratbench-core __serve: socket path %s is longer than %zu bytes\n",
                 path, sizeof addr.sun_path - 1);
    return 2;
  }
  std::strcpy(addr.sun_path, path);
  const int listener = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listener < 0 || bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      listen(listener, 64) != 0) {
    std::fprintf(stderr, "stratbench-core __serve: cannot serve on %s: %s\n", path,
                 std::strerror(errno));
    return 2;
  }
  if (getppid() != parent) return 0;
  const std::string ours = fingerprint();
  signal(SIGCHLD, SIG_IGN);  // sessions are reaped by the kernel
  for (;;) {
    const int conn = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOMEM || errno == ENOBUFS) {
        usleep(100000);  // for now: the fronts meanwhile wait in the backlog
        continue;
      }
      if (errno == EINTR || errno == ECONNABORTED) continue;
      std::fprintf(stderr, "stratbench-core __serve: accept: %s\n", std::strerror(errno));
      return 2;
    }
    const pid_t s = fork();
    if (s == 0) {
      close(listener);
      _exit(session(conn, ours, coreMain));
    }
    close(conn);
  }
}

bool runServed(int argc, char** argv, int* rc) {
  const char* path = std::getenv(kCoreServerEnv);
  if (!path || !*path || (argc > 1 && std::strcmp(argv[1], "launch") == 0)) return false;
  struct sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  if (std::strlen(path) >= sizeof addr.sun_path) return false;
  std::strcpy(addr.sun_path, path);
  char cwd[PATH_MAX];
  const std::vector<int> fds = inherited();
  if (!getcwd(cwd, sizeof cwd) || fds.empty() || fds.size() > kMaxFds) return false;
  const int conn = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (conn < 0) return false;
  if (connect(conn, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(conn);
    return false;
  }
  const mode_t mask = umask(0);
  umask(mask);
  std::string payload;
  put(payload, fingerprint());
  put(payload, cwd);
  char octal[16];
  std::snprintf(octal, sizeof octal, "%o", static_cast<unsigned>(mask));
  put(payload, octal);
  // The signals this process ignores and blocks: so will the command, as after exec.
  sigset_t blockedNow;
  sigprocmask(SIG_SETMASK, nullptr, &blockedNow);
  std::string ignored(NSIG, '0'), blocked(NSIG, '0');
  for (int s = 1; s < NSIG; ++s) {
    struct sigaction old = {};
    if (sigaction(s, nullptr, &old) == 0 && old.sa_handler == SIG_IGN) ignored[static_cast<size_t>(s)] = '1';
    if (sigismember(&blockedNow, s) == 1) blocked[static_cast<size_t>(s)] = '1';
  }
  put(payload, ignored);
  put(payload, blocked);
  std::string numbers;
  for (int fd : fds) numbers += (numbers.empty() ? "" : ",") + std::to_string(fd);
  put(payload, numbers);
  put(payload, std::to_string(argc));
  for (int i = 0; i < argc; ++i) put(payload, argv[i]);
  for (char** e = environ; e && *e; ++e) put(payload, *e);
  if (payload.size() > kMaxPayload) {
    close(conn);
    return false;
  }
  uint32_t header[3] = {kMagic, static_cast<uint32_t>(payload.size()),
                        static_cast<uint32_t>(fds.size())};
  struct iovec iov = {header, sizeof header};
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)] = {};
  struct msghdr msg = {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
  struct cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
  std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  // The forwarded signals wait, from before the command exists until the handler knows its pid.
  sigset_t forwarded, before;
  sigemptyset(&forwarded);
  for (int s : kForwarded) sigaddset(&forwarded, s);
  sigprocmask(SIG_BLOCK, &forwarded, &before);
  ssize_t sent;
  do {
    sent = sendmsg(conn, &msg, MSG_NOSIGNAL);
  } while (sent < 0 && errno == EINTR);
  int32_t pid = 0;
  if (sent != static_cast<ssize_t>(sizeof header) ||
      !writeAll(conn, payload.data(), payload.size()) || !readAll(conn, &pid, sizeof pid) ||
      pid <= 0) {
    close(conn);
    sigprocmask(SIG_SETMASK, &before, nullptr);
    return false;  // nothing ran: exec
  }
  gServedPid = pid;
  struct sigaction sa = {};
  sa.sa_handler = forward;
  sigemptyset(&sa.sa_mask);
  for (int s : kForwarded) {
    if (ignored[static_cast<size_t>(s)] == '0') sigaction(s, &sa, nullptr);
  }
  sigprocmask(SIG_SETMASK, &before, nullptr);
  int32_t status = 0;
  if (!readAll(conn, &status, sizeof status)) {
    std::fprintf(stderr, "stratbench: the core server (%s) went away while running the command\n",
                 path);
    *rc = 2;
    return true;
  }
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    signal(sig, SIG_DFL);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, sig);
    sigprocmask(SIG_UNBLOCK, &set, nullptr);
    raise(sig);
    *rc = 128 + sig;
    return true;
  }
  *rc = WIFEXITED(status) ? WEXITSTATUS(status) : 2;
  return true;
}

}  // namespace sb::cli
