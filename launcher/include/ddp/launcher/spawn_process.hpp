#pragma once
// Starting one worker process: the only place that starts one. The child runs in its own session
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
  std::vector<int> inherit_fds;   // stay open in the child under their own numbers (the
                                  // collective record page, the Python stack file)
  std::vector<int> cpus;          // the CPUs the child may run on (--numa_binding); empty: all
  int group_guard_fd = -1;        // the group guard's channel (GroupReaper::channel()): the
                                  // child sends it its process group before it execs, so that
                                  // no code of the program runs unguarded; -1: none
};

// The program could not be started (clone failed, or execve failed in the child).
class SpawnError : public std::runtime_error {
 public:
  explicit SpawnError(const std::string& what, int error = 0)
      : std::runtime_error(what), error_(error) {}
  // The errno of the failure (EMFILE: out of descriptors), 0 when not known.
  int error() const { return error_; }

 private:
  int error_;
};

// A started child: exec'd, or failing to.
struct SpawnedProcess {
  pid_t pid = 0;         // also its process group and session id, once it has exec'd
  std::string program;   // for the error message
  UniqueFd exec_report;  // EOF once the exec happened; an errno when it failed
};

// Starts a child that execs options.program, as vfork does: the child shares the agent's
// memory (nothing is copied) and the calling thread waits until the child has exec'd or
// failed (the kernel's part of execve up to replacing the memory: well under a millisecond);
// the new program's own loading runs after, so several workers still load in parallel.
// confirm_exec says whether the exec worked. Throws SpawnError when the clone fails. Call
// from the agent's only thread: the parent-death signal is tied to the calling thread.
SpawnedProcess spawn_process(const SpawnOptions& options);

// Reads what the child reported (it has exec'd or failed by the time spawn_process returns,
// so this does not wait); throws SpawnError naming the program and errno when the exec
// failed. The child has then exited with status 127: reap it as usual.
void confirm_exec(SpawnedProcess& process);

}  // namespace ddp::launcher
