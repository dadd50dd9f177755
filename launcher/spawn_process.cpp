#include "ddp/launcher/spawn_process.hpp"

#include <fcntl.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <csignal>
#include <cstring>

namespace ddp::launcher {
namespace {

std::vector<char*> c_strings(const std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  pointers.reserve(strings.size() + 1);
  for (const std::string& s : strings) pointers.push_back(const_cast<char*>(s.c_str()));
  pointers.push_back(nullptr);
  return pointers;
}

// In the child, between fork and exec: only async-signal-safe calls. Reports errno on
// error_fd (close-on-exec, so the parent reads EOF on success) and exits.
[[noreturn]] void exec_child(const SpawnOptions& options, char* const* argv, char* const* envp,
                             pid_t agent, int error_fd) {
  auto fail = [error_fd]() {
    int error = errno;
    [[maybe_unused]] ssize_t n = ::write(error_fd, &error, sizeof error);
    ::_exit(127);
  };
  if (::setpgid(0, 0) != 0) fail();
  if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) fail();
  if (::getppid() != agent) ::_exit(128 + SIGKILL);  // the agent died before prctl took hold
  if (options.stdout_fd >= 0 && ::dup2(options.stdout_fd, STDOUT_FILENO) < 0) fail();
  if (options.stderr_fd >= 0 && ::dup2(options.stderr_fd, STDERR_FILENO) < 0) fail();
  // exec resets caught signals; ignored ones stay ignored. Restore the ones the agent
  // ignores (as Python's subprocess does), and unblock everything.
  ::signal(SIGPIPE, SIG_DFL);
  ::signal(SIGXFSZ, SIG_DFL);
  sigset_t none;
  ::sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::execve(options.program.c_str(), argv, envp);
  fail();
  ::_exit(127);
}

}  // namespace

SpawnedProcess spawn_process(const SpawnOptions& options) {
  std::vector<char*> argv = c_strings(options.argv);
  std::vector<char*> envp = c_strings(options.env);
  int error_pipe[2];
  if (::pipe2(error_pipe, O_CLOEXEC) != 0) {
    throw SpawnError("cannot start " + options.program + ": pipe: " + std::strerror(errno));
  }
  const pid_t agent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) exec_child(options, argv.data(), envp.data(), agent, error_pipe[1]);
  int fork_errno = errno;
  ::close(error_pipe[1]);
  SpawnedProcess process{pid, options.program, UniqueFd(error_pipe[0])};
  if (pid < 0) {
    throw SpawnError("cannot start " + options.program + ": fork: " + std::strerror(fork_errno));
  }
  ::setpgid(pid, pid);  // also from the parent, so that the group exists before we signal it
  return process;
}

void confirm_exec(SpawnedProcess& process) {
  if (!process.exec_report.valid()) return;
  int child_errno = 0;
  ssize_t n;
  do {
    n = ::read(process.exec_report.get(), &child_errno, sizeof child_errno);
  } while (n < 0 && errno == EINTR);
  process.exec_report.reset();
  if (n > 0) {
    throw SpawnError("cannot execute " + process.program + ": " + std::strerror(child_errno));
  }
}

}  // namespace ddp::launcher
