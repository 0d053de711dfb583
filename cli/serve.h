// A fork server for stratbench-core, for the test scripts (ci/test_lib.sh `serve_core`).
//
// Debian's LibTorch loads about 300 shared libraries: every stratbench-core process spends about
// half a second of CPU before main, and the end-to-end scripts start about 500 of them. The
// server is one stratbench-core that has loaded them and waits on a Unix socket
// (`stratbench-core __serve SOCKET`); the front (`stratbench`, front.cpp), where
// STRATBENCH_CORE_SERVER names that socket, sends it the command line, working directory,
// environment, umask, signal dispositions and the descriptors an exec would pass on (standard
// input, output and error, a `<(...)`'s /dev/fd/63, ...), and the server forks a process
// that runs the command as stratbench-core's main would after exec. The front forwards the
// signals it gets to that process and ends as it ended: the same exit code, or killed by the
// same signal. Killed itself (SIGKILL), its command is killed too.
//
// What a fork cannot carry, the server declines, and the front execs stratbench-core as without
// it: a command in another network or mount namespace, under another user or other resource
// limits, CPU affinity or nice value, or with other values of the variables read while the
// libraries load (OMP_*, MKL_*, LD_*, MALLOC_*, TORCH_*, ...); a front without a working
// directory, or with more than 250 descriptors to pass on. `launch` is never
// served (its ranks are its own children, watched as processes). Signals the front ignores or
// blocks, the command does too. What differs: the command has its own pid and shows the
// server's command line; a stop (SIGTSTP, SIGSTOP) of the front does not stop the command.
#pragma once

#include <sys/types.h>

namespace sb::cli {

// The environment variable naming the server's socket.
inline constexpr const char* kCoreServerEnv = "STRATBENCH_CORE_SERVER";

// In stratbench-core: serve forks on the Unix socket PATH, each running `coreMain` on the
// command it was sent, until this process's parent, which must be PARENT, exits. Returns only
// on an error (2, said on stderr), or at once where PARENT is gone.
int serveForks(const char* path, pid_t parent, int (*coreMain)(int, char**));

// In the front: runs the command through the server named by STRATBENCH_CORE_SERVER. Returns
// false, having run nothing, where the variable is unset or empty, the server cannot be reached
// or declines: the caller execs stratbench-core. Otherwise sets *rc to the command's exit code,
// or ends this process with the signal that ended the command.
bool runServed(int argc, char** argv, int* rc);

}  // namespace sb::cli
