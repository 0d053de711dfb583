// The fork server of stratbench-core and its client in the front (see serve.h). No LibTorch
// here: the front links this file too.
//
// The exchange, over a Unix stream socket: the front sends a header (magic, payload size) with
// its descriptors 0, 1 and 2 (SCM_RIGHTS), then the payload: strings, each a 32-bit length and
// its bytes: the fingerprint, the working directory, the umask, argc, the arguments, the
// environment. The server answers with a 32-bit pid (0: declined, the socket then closes), and
// when that process has ended, its 32-bit wait status.

#include "cli/serve.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
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
  f += "uid=" + std::to_string(getuid()) + " gid=" + std::to_string(getgid()) + '\n';
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
    const ssize_t w = ::write(fd, p, n);
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

// One connection, in a process of its own: reads the command, forks the process that runs it,
// answers with its pid and, when it ends, its status. The front gone, the command is killed.
int session(int conn, const std::string& ours, int (*coreMain)(int, char**)) {
  signal(SIGCHLD, SIG_DFL);
  uint32_t header[2] = {};
  int fds[3] = {-1, -1, -1};
  {
    struct iovec iov = {header, sizeof header};
    alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof fds)];
    struct msghdr msg = {};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    ssize_t r;
    do {
      r = ::recvmsg(conn, &msg, MSG_CMSG_CLOEXEC | MSG_WAITALL);
    } while (r < 0 && errno == EINTR);
    if (r != static_cast<ssize_t>(sizeof header) || header[0] != kMagic ||
        header[1] > kMaxPayload) {
      return 1;
    }
    struct cmsghdr* c = CMSG_FIRSTHDR(&msg);
    if (!c || c->cmsg_type != SCM_RIGHTS || c->cmsg_len != CMSG_LEN(sizeof fds)) return 1;
    std::memcpy(fds, CMSG_DATA(c), sizeof fds);
  }
  std::string payload(header[1], '\0');
  if (!readAll(conn, payload.data(), payload.size())) return 1;
  size_t at = 0;
  std::string theirs, cwd, mask, count;
  if (!take(payload, at, theirs) || !take(payload, at, cwd) || !take(payload, at, mask) ||
      !take(payload, at, count)) {
    return 1;
  }
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
    for (int s = 1; s < NSIG; ++s) {
      if (s != SIGKILL && s != SIGSTOP) signal(s, SIG_DFL);
    }
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    for (int i = 0; i < 3; ++i) {
      if (dup2(fds[i], i) < 0) _exit(2);
    }
    for (int fd : fds) {
      if (fd > 2) close(fd);
    }
    close(conn);
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
  if (gServedPid > 0) kill(static_cast<pid_t>(gServedPid), sig);
}

}  // namespace

int serveForks(const char* path, int (*coreMain)(int, char**)) {
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
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  const pid_t parent = getppid();
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
  for (int fd = 0; fd < 3; ++fd) {
    if (fcntl(fd, F_GETFD) < 0) return false;  // a closed standard descriptor: exec
  }
  const int conn = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (conn < 0) return false;
  if (connect(conn, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(conn);
    return false;
  }
  char cwd[PATH_MAX];
  const mode_t mask = umask(0);
  umask(mask);
  std::string payload;
  put(payload, fingerprint());
  put(payload, getcwd(cwd, sizeof cwd) ? cwd : "/");
  char octal[16];
  std::snprintf(octal, sizeof octal, "%o", static_cast<unsigned>(mask));
  put(payload, octal);
  put(payload, std::to_string(argc));
  for (int i = 0; i < argc; ++i) put(payload, argv[i]);
  for (char** e = environ; e && *e; ++e) put(payload, *e);
  if (payload.size() > kMaxPayload) {
    close(conn);
    return false;
  }
  uint32_t header[2] = {kMagic, static_cast<uint32_t>(payload.size())};
  int fds[3] = {0, 1, 2};
  struct iovec iov = {header, sizeof header};
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof fds)] = {};
  struct msghdr msg = {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  struct cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof fds);
  std::memcpy(CMSG_DATA(c), fds, sizeof fds);
  ssize_t sent;
  do {
    sent = sendmsg(conn, &msg, MSG_NOSIGNAL);
  } while (sent < 0 && errno == EINTR);
  int32_t pid = 0;
  if (sent != static_cast<ssize_t>(sizeof header) ||
      !writeAll(conn, payload.data(), payload.size()) || !readAll(conn, &pid, sizeof pid) ||
      pid <= 0) {
    close(conn);
    return false;  // nothing ran: exec
  }
  gServedPid = pid;
  struct sigaction sa = {};
  sa.sa_handler = forward;
  sigemptyset(&sa.sa_mask);
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM}) {
    sigaction(s, &sa, nullptr);
  }
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
