#pragma once
// Starting one worker process: the only place that forks. The child runs in its own session
// and process group (so a terminal's Ctrl-C reaches the agent, which forwards it, while the
// worker can still read the terminal, as under torchrun) and gets SIGKILL when
// the agent dies (PR_SET_PDEATHSIG), so that not even `kill -9` of the agent leaves it behind.

#include <sys/types.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "ddp/launcher/unique_fd.hpp"

namespace ddp::launcher {

struct SpawnOptions {
  std::string program;            // path passed to execve
  std::vector<std::string> argv;  // argv[0] onwards
  std::vector<std::string> env;   // "KEY=VALUE", the whole environment
  int stdout_fd = -1;             // becomes the child's fd 1; -1 inherits the agent's
  int stderr_fd = -1;             // becomes the child's fd 2; -1 inherits the agent's
  int inherit_fd = -1;            // stays open in the child under its own number (the
                                  // collective record page); -1: none
};

// The program could not be started (fork failed, or execve failed in the child).
class SpawnError : public std::runtime_error {
 public:
  explicit SpawnError(const std::string& what, int error = 0)
      : std::runtime_error(what), error_(error) {}
  // The errno of the failure (EMFILE: out of descriptors), 0 when not known.
  int error() const { return error_; }

 private:
  int error_;
};

// A forked child on its way to exec.
struct SpawnedProcess {
  pid_t pid = 0;         // also its process group and session id, once it has exec'd
  std::string program;   // for the error message
  UniqueFd exec_report;  // EOF once the exec happened; an errno when it failed
};

// Forks; the child execs options.program. Returns at once, without waiting for the exec,
// so that several workers exec in parallel; confirm_exec says whether it worked. Throws
// SpawnError when fork fails. Call from the agent's only thread: the parent-death signal is
// tied to the calling thread.
SpawnedProcess spawn_process(const SpawnOptions& options);

// Waits until the child has exec'd (microseconds to milliseconds: the time the kernel takes
// to load the program); throws SpawnError naming the program and errno when the exec
// failed. The child has then exited with status 127: reap it as usual.
void confirm_exec(SpawnedProcess& process);

}  // namespace ddp::launcher
