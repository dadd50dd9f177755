#include "ddp/launcher/spawn_process.hpp"

#include <fcntl.h>
#include <linux/close_range.h>
#include <pthread.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <csignal>
#include <cstdint>
#include <cstring>
#include <memory>

#include "process/blocked_signals.hpp"

namespace ddp::launcher {
namespace {

std::vector<char*> c_strings(const std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  pointers.reserve(strings.size() + 1);
  for (const std::string& s : strings) pointers.push_back(const_cast<char*>(s.c_str()));
  pointers.push_back(nullptr);
  return pointers;
}

// Code that runs in the vfork-like child (on a stack of its own, see spawn_process) is not
// instrumented by AddressSanitizer: its poisoned stack redzones would outlive the exec.
#if defined(__SANITIZE_ADDRESS__)
#define DDP_CHILD_OF_VFORK __attribute__((no_sanitize_address))
#else
#define DDP_CHILD_OF_VFORK
#endif

// The child's stack until it execs: exec_child's frames and the libc calls it makes need a
// few kilobytes.
constexpr std::size_t kChildStackBytes = 64 * 1024;

// getdents64's record (<dirent.h> declares no such struct before glibc 2.30).
struct LinuxDirent64 {
  std::uint64_t inode;
  std::int64_t offset;
  unsigned short length;
  unsigned char type;
  char name[1];  // NUL-terminated, `length` bounds the record
};

// The descriptor a /proc/self/fd entry names; -1 for "." and "..".
DDP_CHILD_OF_VFORK int descriptor_of(const char* name) {
  if (*name < '0' || *name > '9') return -1;
  int fd = 0;
  for (; *name >= '0' && *name <= '9'; ++name) fd = fd * 10 + (*name - '0');
  return fd;
}

// Kernels before 5.11 (no CLOSE_RANGE_CLOEXEC): one fcntl per descriptor open, as listed in
// /proc/self/fd, read with open and getdents64 (async-signal-safe, no allocation; opendir and
// readdir allocate). False when /proc cannot be read.
DDP_CHILD_OF_VFORK bool cloexec_open_ones_from_3() {
  const int dir = ::open("/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) return false;
  alignas(LinuxDirent64) char buffer[2048];
  long n;
  while ((n = ::syscall(SYS_getdents64, dir, buffer, sizeof buffer)) > 0) {
    for (long at = 0; at < n;) {
      const auto* entry = reinterpret_cast<const LinuxDirent64*>(buffer + at);
      at += entry->length;
      const int fd = descriptor_of(entry->name);
      if (fd >= 3 && fd != dir) ::fcntl(fd, F_SETFD, FD_CLOEXEC);
    }
  }
  ::close(dir);
  return n == 0;
}

// Marks every descriptor from 3 up close-on-exec, so that a worker inherits only its standard
// streams (as torchrun's close_fds=True subprocesses do): sockets of the agent's store
// server, which Asio opens without SOCK_CLOEXEC, must not leak into workers. Async-signal-safe.
// Its time is bounded by the descriptors open, not by RLIMIT_NOFILE (container runtimes set
// 2^30: one fcntl per possible descriptor took minutes).
DDP_CHILD_OF_VFORK void cloexec_from_3() {
  if (::syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC) == 0) return;
  if (cloexec_open_ones_from_3()) return;
  rlimit limit{};  // no /proc either: one fcntl per possible descriptor
  const rlim_t max = ::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY
                         ? limit.rlim_cur
                         : 65536;
  for (rlim_t fd = 3; fd < max; ++fd) ::fcntl(static_cast<int>(fd), F_SETFD, FD_CLOEXEC);
}

// Tells the group guard (GroupReaper) this child's process group, before the program runs:
// from then on a kill -9 of the agent takes the group with it. Best effort: the agent sends the
// same after spawn_process returns.
DDP_CHILD_OF_VFORK void announce_group(int guard_fd) {
  if (guard_fd < 0) return;
  const std::int32_t group = ::getpid();  // after setsid: the group's id too
  [[maybe_unused]] ssize_t n = ::send(guard_fd, &group, sizeof group, MSG_DONTWAIT | MSG_NOSIGNAL);
}

// In the child, between clone and exec, on its own stack but in the agent's memory (the agent
// is suspended meanwhile, see spawn_process): only async-signal-safe calls, nothing that
// allocates or writes the agent's data. Reports errno on error_fd (close-on-exec, so the parent
// reads EOF on success) and exits.
DDP_CHILD_OF_VFORK [[noreturn]] void exec_child(const SpawnOptions& options, char* const* argv,
                                                char* const* envp, const cpu_set_t* cpus,
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
  announce_group(options.group_guard_fd);
  if (options.stdout_fd >= 0 && ::dup2(options.stdout_fd, STDOUT_FILENO) < 0) fail();
  if (options.stderr_fd >= 0 && ::dup2(options.stderr_fd, STDERR_FILENO) < 0) fail();
  if (cpus && ::sched_setaffinity(0, sizeof(cpu_set_t), cpus) != 0) fail();
  cloexec_from_3();
  for (const int fd : options.inherit_fds) {
    if (::fcntl(fd, F_SETFD, 0) != 0) fail();
  }
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

struct ChildArguments {
  const SpawnOptions* options;
  char* const* argv;
  char* const* envp;
  const cpu_set_t* cpus;  // null: the agent's affinity
  pid_t agent;
  int error_fd;
};

DDP_CHILD_OF_VFORK int child_main(void* arguments) {
  const auto* a = static_cast<const ChildArguments*>(arguments);
  exec_child(*a->options, a->argv, a->envp, a->cpus, a->agent, a->error_fd);
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
  cpu_set_t cpus;  // built here: the child may not allocate
  CPU_ZERO(&cpus);
  for (const int cpu : options.cpus) {
    if (cpu >= 0 && cpu < CPU_SETSIZE) CPU_SET(cpu, &cpus);
  }
  ChildArguments arguments{&options,    argv.data(),
                           envp.data(), options.cpus.empty() ? nullptr : &cpus,
                           ::getpid(),  error_pipe[1]};
  // As posix_spawn does: the child shares the agent's memory until it execs (CLONE_VM) and
  // the agent waits for that (CLONE_VFORK), so nothing of the agent is copied or made
  // copy-on-write. A fork of the agent cost more than the worker's whole exec (page tables
  // copied, then a page fault and a TLB flush for each page the agent wrote afterwards).
  // The child gets a copy of the signal handlers (no CLONE_SIGHAND) and of the descriptor
  // table (no CLONE_FILES), so what it changes there stays its own.
  std::unique_ptr<char[]> stack(new char[kChildStackBytes]);
  void* stack_top = stack.get() + kChildStackBytes;  // grows down; new[] aligns for any type
  pid_t pid;
  int fork_errno;
  {
    BlockAllSignals blocked;
    pid = ::clone(child_main, stack_top, CLONE_VM | CLONE_VFORK | SIGCHLD, &arguments);
    fork_errno = errno;
  }
  ::close(error_pipe[1]);
  SpawnedProcess process{pid, options.program, UniqueFd(error_pipe[0])};
  if (pid < 0) {
    throw SpawnError("cannot start " + options.program + ": clone: " + std::strerror(fork_errno),
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
