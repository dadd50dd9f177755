#include "ddp/launcher/spawn_process.hpp"

#include <fcntl.h>
#include <linux/close_range.h>
#include <pthread.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
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

// Marks every descriptor from 3 up close-on-exec, so that a worker inherits only its standard
// streams (as torchrun's close_fds=True subprocesses do): sockets of the agent's store
// server, which Asio opens without SOCK_CLOEXEC, must not leak into workers. Async-signal-safe.
void cloexec_from_3() {
  if (::syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC) == 0) return;
  rlimit limit{};  // kernels before 5.11: one fcntl per possible descriptor
  const rlim_t max = ::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY
                         ? limit.rlim_cur
                         : 65536;
  for (rlim_t fd = 3; fd < max; ++fd) ::fcntl(static_cast<int>(fd), F_SETFD, FD_CLOEXEC);
}

// Blocks every signal on the calling thread while alive and restores the mask after, so that
// a signal arriving during fork is not run in the child by the agent's (Asio's) handler,
// which would report it to the agent a second time through Asio's signal pipe.
class BlockAllSignals {
 public:
  BlockAllSignals() {
    sigset_t all;
    ::sigfillset(&all);
    ::pthread_sigmask(SIG_SETMASK, &all, &saved_);
  }
  ~BlockAllSignals() { ::pthread_sigmask(SIG_SETMASK, &saved_, nullptr); }
  BlockAllSignals(const BlockAllSignals&) = delete;
  BlockAllSignals& operator=(const BlockAllSignals&) = delete;

 private:
  sigset_t saved_;
};

// In the child, between fork and exec: only async-signal-safe calls. Reports errno on
// error_fd (close-on-exec, so the parent reads EOF on success) and exits.
[[noreturn]] void exec_child(const SpawnOptions& options, char* const* argv, char* const* envp,
                             pid_t agent, int error_fd) {
  auto fail = [error_fd]() {
    int error = errno;
    [[maybe_unused]] ssize_t n = ::write(error_fd, &error, sizeof error);
    ::_exit(127);
  };
  // Its own session, hence its own process group: not a background group of the agent's
  // terminal, so that reading it (input(), pdb) works as under torchrun instead of stopping
  // the worker with SIGTTIN.
  if (::setsid() < 0) fail();
  if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) fail();
  if (::getppid() != agent) ::_exit(128 + SIGKILL);  // the agent died before prctl took hold
  if (options.stdout_fd >= 0 && ::dup2(options.stdout_fd, STDOUT_FILENO) < 0) fail();
  if (options.stderr_fd >= 0 && ::dup2(options.stderr_fd, STDERR_FILENO) < 0) fail();
  cloexec_from_3();
  if (options.inherit_fd >= 0 && ::fcntl(options.inherit_fd, F_SETFD, 0) != 0) fail();
  // Signals are blocked (see BlockAllSignals). Caught ones go back to their default before
  // they are unblocked, so that none pending runs the agent's handler here; exec would reset
  // them anyway. Ignored ones stay ignored, except the ones the agent ignores itself
  // (restored as Python's subprocess does). Then unblock everything.
  for (int s = 1; s < NSIG; ++s) {
    struct sigaction action {};
    if (::sigaction(s, nullptr, &action) == 0 && action.sa_handler != SIG_IGN &&
        action.sa_handler != SIG_DFL) {
      ::signal(s, SIG_DFL);
    }
  }
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
    const int error = errno;
    throw SpawnError("cannot start " + options.program + ": pipe: " + std::strerror(error), error);
  }
  const pid_t agent = ::getpid();
  pid_t pid;
  int fork_errno;
  {
    BlockAllSignals blocked;
    pid = ::fork();
    if (pid == 0) exec_child(options, argv.data(), envp.data(), agent, error_pipe[1]);
    fork_errno = errno;
  }
  ::close(error_pipe[1]);
  SpawnedProcess process{pid, options.program, UniqueFd(error_pipe[0])};
  if (pid < 0) {
    throw SpawnError("cannot start " + options.program + ": fork: " + std::strerror(fork_errno),
                     fork_errno);
  }
  // No setpgid from here: it would make the child a group leader, and then its setsid fails.
  // Until the child's setsid the group does not exist: Worker::signal_group falls back to
  // the pid.
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
    throw SpawnError("cannot execute " + process.program + ": " + std::strerror(child_errno),
                     child_errno);
  }
}

}  // namespace ddp::launcher
