#pragma once
// Starting one worker process: the only place that forks. The child runs in its own process
// group (so a terminal's Ctrl-C reaches the agent, which forwards it) and gets SIGKILL when
// the agent dies (PR_SET_PDEATHSIG), so that not even `kill -9` of the agent leaves it behind.

#include <sys/types.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace ddp::launcher {

struct SpawnOptions {
  std::string program;            // path passed to execve
  std::vector<std::string> argv;  // argv[0] onwards
  std::vector<std::string> env;   // "KEY=VALUE", the whole environment
  int stdout_fd = -1;             // becomes the child's fd 1; -1 inherits the agent's
  int stderr_fd = -1;             // becomes the child's fd 2; -1 inherits the agent's
};

// The program could not be started (fork failed, or execve failed in the child).
class SpawnError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Forks and execs; returns the child's pid, which is also its process group id. Returns only
// once the exec has happened (or throws SpawnError naming the program and errno, after
// reaping the child). Call from the agent's only thread: the parent-death signal is tied to
// the calling thread.
pid_t spawn_process(const SpawnOptions& options);

}  // namespace ddp::launcher
