#pragma once
// A small guard process that SIGKILLs the workers' process groups when the agent dies without
// stopping them (kill -9). The workers themselves die by their parent-death signal, but
// their own children (helpers, data loaders) have none and would live on; a process outside
// the agent is the only one left to signal their groups. Internal to the launcher library.

#include <sys/types.h>

#include "ddp/launcher/unique_fd.hpp"

namespace ddp::launcher {

class GroupReaper {
 public:
  // Starts the guard (its own session, standard streams on /dev/null, no other descriptor of
  // the agent): a process that shares the agent's memory (clone with CLONE_VM, on a stack of
  // its own; forked on architectures other than x86-64 and AArch64) and makes only raw system
  // calls. A kill -9 of the agent leaves the memory to the guard; a core dump of the agent on
  // a kernel before 5.16 also ends the guard (the workers still die by their parent-death
  // signal). Throws std::system_error when it cannot. Call from the agent's loop thread, before
  // the first worker starts; other threads may exist (the console writer).
  GroupReaper();
  // Closes the channel: the guard kills the groups still watched (none after an orderly
  // end) and exits; reaps it, SIGKILLing it if it has not exited after kExitTimeout; then
  // frees its stack.
  ~GroupReaper();
  GroupReaper(const GroupReaper&) = delete;
  GroupReaper& operator=(const GroupReaper&) = delete;

  // Process group pgid is to be killed if the agent dies; forget() it once the agent has
  // stopped the group itself (a pgid of a group that is gone can be reused). Never blocks;
  // a guard that has gone away is ignored.
  void watch(pid_t pgid);
  void forget(pid_t pgid);

  pid_t pid() const { return pid_; }
  // The agent's end of the channel, for a worker to announce its own group before it execs
  // (SpawnOptions::group_guard_fd; a message is a pgid as int32, as watch() sends); -1 once
  // the guard has gone. Close-on-exec.
  int channel() const { return channel_.valid() ? channel_.get() : -1; }

 private:
  void send(pid_t value);
  void release_stack();

  pid_t pid_ = -1;
  void* stack_ = nullptr;  // the guard's stack while it shares our memory
  UniqueFd channel_;       // the agent's end of a socket pair; EOF tells the guard the agent died
};

}  // namespace ddp::launcher
