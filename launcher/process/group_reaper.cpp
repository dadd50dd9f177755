#include "process/group_reaper.hpp"

#include <fcntl.h>
#include <linux/close_range.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <system_error>

#include "process/blocked_signals.hpp"

namespace ddp::launcher {
namespace {

// How long the guard may take to exit once the agent closes the channel.
constexpr std::chrono::milliseconds kExitTimeout{1000};
// Groups the guard can hold at once: more than the largest --nproc_per_node.
constexpr std::size_t kMaxGroups = 8192;
// The guard's stack: its group list and a few small frames. Reserved, not committed: only the
// pages it touches are allocated.
constexpr std::size_t kGuardStackBytes = 128 * 1024;

// The guard's code is not instrumented by AddressSanitizer, whose checks use state of the
// agent's threads.
#if defined(__SANITIZE_ADDRESS__)
#define DDP_GUARD_CODE __attribute__((no_sanitize_address))
#else
#define DDP_GUARD_CODE
#endif

// The guard shares the agent's memory (see GroupReaper()), so it may not touch what the agent's
// threads use: not errno, not glibc's per-thread state (its read() and open() are cancellation
// points that mark the calling thread), not the heap. It makes its system calls itself, and
// keeps its data on its own stack. On other architectures the guard is forked instead.
#if defined(__x86_64__) || defined(__aarch64__)
constexpr bool kGuardSharesMemory = true;
#else
constexpr bool kGuardSharesMemory = false;
#endif

// A system call without errno: the result, or -errno.
DDP_GUARD_CODE long raw_syscall(long number, long a = 0, long b = 0, long c = 0, long d = 0) {
#if defined(__x86_64__)
  long result;
  register long r10 asm("r10") = d;
  asm volatile("syscall"
               : "=a"(result)
               : "a"(number), "D"(a), "S"(b), "d"(c), "r"(r10)
               : "rcx", "r11", "memory");
  return result;
#elif defined(__aarch64__)
  register long x8 asm("x8") = number;
  register long x0 asm("x0") = a;
  register long x1 asm("x1") = b;
  register long x2 asm("x2") = c;
  register long x3 asm("x3") = d;
  asm volatile("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3) : "memory");
  return x0;
#else
  long result = ::syscall(number, a, b, c, d);  // forked: errno is the guard's own
  return result < 0 ? -errno : result;
#endif
}

// The kernel's struct sigaction starts with the handler on every architecture above; the
// rest is only ever zero here (SIG_DFL, no flags, empty mask) or read back and ignored.
struct KernelSigaction {
  void* handler;
  unsigned long flags;
  void* restorer;
  unsigned long mask[2];
};

// Reads one message (a pgid, negative to forget it); false at EOF or on error.
DDP_GUARD_CODE bool read_message(int fd, std::int32_t& value) {
  auto* bytes = reinterpret_cast<char*>(&value);
  std::size_t got = 0;
  while (got < sizeof value) {
    long n = raw_syscall(SYS_read, fd, reinterpret_cast<long>(bytes + got),
                         static_cast<long>(sizeof value - got));
    if (n == -EINTR) continue;
    if (n <= 0) return false;
    got += static_cast<std::size_t>(n);
  }
  return true;
}

// The guard: raw system calls and its own stack only (see above). Waits for the agent's end
// of the channel to close (that is its job: no timeout), then kills what is still watched.
// Starts with every signal blocked (GroupReaper()).
[[noreturn]] DDP_GUARD_CODE void guard_main(int channel) {
  raw_syscall(SYS_setsid);  // away from the terminal's signals
  // Not the agent's handlers: caught signals go back to their default (ignored ones stay
  // ignored), then unblock them all.
  constexpr long kSigsetBytes = 8;
  for (long s = 1; s <= 64; ++s) {
    KernelSigaction old{};
    if (raw_syscall(SYS_rt_sigaction, s, 0, reinterpret_cast<long>(&old), kSigsetBytes) == 0 &&
        old.handler != reinterpret_cast<void*>(SIG_IGN) &&
        old.handler != reinterpret_cast<void*>(SIG_DFL)) {
      KernelSigaction fallback{};  // SIG_DFL
      raw_syscall(SYS_rt_sigaction, s, reinterpret_cast<long>(&fallback), 0, kSigsetBytes);
    }
  }
  unsigned long none[2] = {0, 0};
  raw_syscall(SYS_rt_sigprocmask, SIG_SETMASK, reinterpret_cast<long>(none), 0, kSigsetBytes);
  // The channel to fd 3 first: it may be one of 0-2 when the agent started without them.
  if (channel != 3 && raw_syscall(SYS_dup3, channel, 3, 0) < 0) raw_syscall(SYS_exit_group, 1);
  static constexpr char kDevNull[] = "/dev/null";
  const long null_fd =
      raw_syscall(SYS_openat, AT_FDCWD, reinterpret_cast<long>(kDevNull), O_RDWR | O_CLOEXEC);
  for (long fd = 0; fd < 3 && null_fd >= 0; ++fd) {
    if (fd != null_fd) raw_syscall(SYS_dup3, null_fd, fd, 0);
  }
  if (raw_syscall(SYS_close_range, 4, ~0U, 0) != 0) {
    for (long fd = 4; fd < 65536; ++fd) raw_syscall(SYS_close, fd);
  }
  pid_t groups[kMaxGroups];  // not zeroed: only the first `count` are read
  std::size_t count = 0;
  std::int32_t value = 0;
  while (read_message(3, value)) {
    if (value > 0) {  // a group may come twice: from its worker, then from the agent
      bool known = false;
      for (std::size_t i = 0; i < count && !known; ++i) known = groups[i] == value;
      if (!known && count < kMaxGroups) groups[count++] = value;
    } else if (value < 0) {
      for (std::size_t i = 0; i < count; ++i) {
        if (groups[i] == -value) {
          groups[i] = groups[--count];
          break;
        }
      }
    }
  }
  for (std::size_t i = 0; i < count; ++i) raw_syscall(SYS_kill, -groups[i], SIGKILL);
  raw_syscall(SYS_exit_group, 0);
  __builtin_unreachable();
}

DDP_GUARD_CODE int guard_entry(void* channel) {
  guard_main(static_cast<int>(reinterpret_cast<std::intptr_t>(channel)));
}

}  // namespace

GroupReaper::GroupReaper() {
  int ends[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ends) != 0) {
    throw std::system_error(errno, std::generic_category(), "group guard: socketpair");
  }
  UniqueFd agent_end(ends[0]);
  UniqueFd guard_end(ends[1]);
  BlockAllSignals blocked;
  if (kGuardSharesMemory) {
    // Like a thread, but a process of its own that outlives the agent (kill -9 ends only the
    // agent's thread group; the memory stays for the guard): nothing of the agent is copied
    // or made copy-on-write, where a fork cost the launch ~6 ms of page faults on 2 cores.
    // The guard keeps its own copy of the descriptor table and signal handlers.
    void* stack = ::mmap(nullptr, kGuardStackBytes, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK | MAP_NORESERVE, -1, 0);
    if (stack == MAP_FAILED) {
      throw std::system_error(errno, std::generic_category(), "group guard: stack");
    }
    stack_ = stack;
    void* channel = reinterpret_cast<void*>(static_cast<std::intptr_t>(guard_end.get()));
    pid_ = ::clone(guard_entry, static_cast<char*>(stack) + kGuardStackBytes, CLONE_VM | SIGCHLD,
                   channel);
  } else {
    pid_ = ::fork();
    if (pid_ == 0) guard_main(guard_end.get());
  }
  if (pid_ < 0) {
    const int error = errno;
    release_stack();
    throw std::system_error(error, std::generic_category(), "group guard: clone");
  }
  channel_ = std::move(agent_end);
}

void GroupReaper::release_stack() {
  if (stack_) ::munmap(stack_, kGuardStackBytes);
  stack_ = nullptr;
}

GroupReaper::~GroupReaper() {
  channel_.reset();
  if (pid_ <= 0) return;
  UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0)));
  pollfd exited{pidfd.get(), POLLIN, 0};
  if (!pidfd.valid() || ::poll(&exited, 1, static_cast<int>(kExitTimeout.count())) != 1) {
    ::kill(pid_, SIGKILL);
  }
  while (::waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
  }
  release_stack();  // the guard is gone: nothing runs on it any more
}

void GroupReaper::watch(pid_t pgid) { send(pgid); }

void GroupReaper::forget(pid_t pgid) { send(-pgid); }

void GroupReaper::send(pid_t value) {
  if (!channel_.valid() || value == 0) return;
  const std::int32_t message = value;
  // A message is 4 bytes and the socket buffer holds thousands: it goes in one piece, or
  // not at all when the guard is gone (then stop sending) or stalled (then drop it: closing
  // the channel would make the guard kill running workers).
  ssize_t n;
  do {
    n = ::send(channel_.get(), &message, sizeof message, MSG_NOSIGNAL | MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) channel_.reset();
}

}  // namespace ddp::launcher
