// GroupReaper, the guard that kills the workers' process groups when the agent dies: a worker
// started with the guard's channel (SpawnOptions::group_guard_fd) is the guard's before its
// program runs, so that an agent killed right after the spawn, before it could watch() the
// group, leaves nothing behind.
#include "process/group_reaper.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <csignal>
#include <string>

#include "ddp/launcher/spawn_process.hpp"
#include "process_harness.hpp"

using namespace ddp::launcher;
using ddp::test::wait_for_process_exit;

namespace {

// A shell whose own child (in its group) sleeps; the child's pid comes as a line on `out`.
SpawnOptions shell_with_child(int out, int guard_fd) {
  SpawnOptions options;
  options.program = "/bin/sh";
  options.argv = {"sh", "-c", "sleep 600 & echo $!; wait"};
  options.env = {"PATH=/usr/bin:/bin"};
  options.stdout_fd = out;
  options.group_guard_fd = guard_fd;
  return options;
}

// The first line on fd, waiting at most ddp::test::kProcessTimeout for it.
std::string read_line(int fd) {
  std::string line;
  char c;
  pollfd readable{fd, POLLIN, 0};
  while (::poll(&readable, 1, static_cast<int>(ddp::test::kProcessTimeout.count())) == 1 &&
         ::read(fd, &c, 1) == 1 && c != '\n') {
    line += c;
  }
  return line;
}

struct Started {
  pid_t shell = 0;  // the worker: our child, leader of its group
  pid_t child = 0;  // the worker's own child, in the worker's group
};

Started start(GroupReaper& reaper) {
  int pipe[2];
  REQUIRE(::pipe2(pipe, O_CLOEXEC) == 0);
  SpawnedProcess process = spawn_process(shell_with_child(pipe[1], reaper.channel()));
  ::close(pipe[1]);
  confirm_exec(process);
  Started started{process.pid, static_cast<pid_t>(std::stol("0" + read_line(pipe[0])))};
  ::close(pipe[0]);
  return started;
}

int reap(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

}  // namespace

TEST_CASE("a worker's group is the guard's from before its program runs") {
  Started started;
  {
    GroupReaper reaper;
    started = start(reaper);
    REQUIRE(started.child > 0);
    // No reaper.watch(): as when the agent is killed right after the spawn.
  }  // the channel closes as at the agent's death: the guard kills the groups it knows
  const bool child_gone = wait_for_process_exit(started.child);
  if (!child_gone) ::kill(started.child, SIGKILL);
  CHECK(child_gone);
  const bool shell_gone = wait_for_process_exit(started.shell);
  if (!shell_gone) ::kill(started.shell, SIGKILL);
  const int status = reap(started.shell);
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGKILL);
}

TEST_CASE("a group announced by its worker and watched by the agent is forgotten at once") {
  Started started;
  {
    GroupReaper reaper;
    started = start(reaper);
    REQUIRE(started.child > 0);
    reaper.watch(started.shell);   // the agent's own message, after the worker's
    reaper.forget(started.shell);  // the agent stopped the group itself
  }  // the guard has exited (reaped by the destructor): whatever it killed is dead by now
  // Both still run (a killed one would be a zombie: kill(pid, 0) cannot tell).
  CHECK(ddp::test::live_processes_in_group(started.shell).size() == 2);
  ::kill(-started.shell, SIGKILL);
  reap(started.shell);
}
