#include "shared/tool_run.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

extern char** environ;

namespace ddp::launcher {

ToolRun run_tool(const std::vector<std::string>& argv, std::chrono::milliseconds timeout,
                 std::size_t max_output) {
  ToolRun run;
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) {
    run.spawn_error = errno;
    return run;
  }
  posix_spawn_file_actions_t actions;
  ::posix_spawn_file_actions_init(&actions);
  ::posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  ::posix_spawn_file_actions_adddup2(&actions, out[1], STDERR_FILENO);
  std::vector<char*> args;
  for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  pid_t child = 0;
  run.spawn_error = ::posix_spawnp(&child, args[0], &actions, nullptr, args.data(), environ);
  ::posix_spawn_file_actions_destroy(&actions);
  ::close(out[1]);
  if (run.spawn_error != 0) {
    ::close(out[0]);
    return run;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto left = [&deadline] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(deadline -
                                                                 std::chrono::steady_clock::now());
  };
  for (;;) {
    pollfd readable{out[0], POLLIN, 0};
    const int ready =
        left().count() <= 0 ? 0 : ::poll(&readable, 1, static_cast<int>(left().count()));
    if (ready < 0 && errno == EINTR) continue;  // a signal for the agent, not the deadline
    if (ready <= 0) {
      run.timed_out = true;
      break;
    }
    char buffer[8192];
    const ssize_t n = ::read(out[0], buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // end of file: the tool (and whatever it started) closed its output
    const std::size_t room = max_output - std::min(max_output, run.output.size());
    run.output.append(buffer, std::min(room, static_cast<std::size_t>(n)));
  }
  ::close(out[0]);
  // A tool that closed its output may still not exit: the deadline holds for its exit too.
  int status = 0;
  pid_t reaped = 0;
  while (!run.timed_out) {
    reaped = ::waitpid(child, &status, WNOHANG);
    if (reaped == child || (reaped < 0 && errno != EINTR)) break;
    if (left().count() <= 0) {
      run.timed_out = true;
      break;
    }
    const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, child, 0));
    if (pidfd >= 0) {  // wait for its exit, or the deadline
      pollfd exited{pidfd, POLLIN, 0};
      ::poll(&exited, 1, static_cast<int>(std::max<long long>(left().count(), 1)));
      ::close(pidfd);
    } else {  // kernels before 5.3
      ::usleep(10000);
    }
  }
  if (run.timed_out) {
    ::kill(child, SIGKILL);
    while ((reaped = ::waitpid(child, &status, 0)) < 0 && errno == EINTR) {
    }
  }
  if (!run.timed_out && reaped == child && WIFEXITED(status)) {
    run.exited = true;
    run.exit_code = WEXITSTATUS(status);
  }
  return run;
}

}  // namespace ddp::launcher
