#include "group_reaper.hpp"

#include <fcntl.h>
#include <linux/close_range.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <system_error>

namespace ddp::launcher {
namespace {

// How long the guard may take to exit once the agent closes the channel.
constexpr std::chrono::milliseconds kExitTimeout{1000};
// Groups the guard can hold at once: more than the largest --nproc_per_node.
constexpr std::size_t kMaxGroups = 8192;

// Reads one message (a pgid, negative to forget it); false at EOF or on error.
bool read_message(int fd, std::int32_t& value) {
  auto* bytes = reinterpret_cast<char*>(&value);
  std::size_t got = 0;
  while (got < sizeof value) {
    ssize_t n = ::read(fd, bytes + got, sizeof value - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    got += static_cast<std::size_t>(n);
  }
  return true;
}

// The guard, between fork and _exit: async-signal-safe calls only. Waits for the agent's end
// of the channel to close (that is its job: no timeout), then kills what is still watched.
[[noreturn]] void guard_main(int channel) {
  ::setsid();  // away from the terminal's signals
  for (int s = 1; s < NSIG; ++s) {
    struct sigaction action {};
    if (::sigaction(s, nullptr, &action) == 0 && action.sa_handler != SIG_IGN &&
        action.sa_handler != SIG_DFL) {
      ::signal(s, SIG_DFL);  // not the agent's handlers
    }
  }
  // The channel to fd 3 first: it may be one of 0-2 when the agent started without them.
  if (channel != 3 && ::dup2(channel, 3) < 0) ::_exit(1);
  int null_fd = ::open("/dev/null", O_RDWR);
  for (int fd = 0; fd < 3 && null_fd >= 0; ++fd) ::dup2(null_fd, fd);
  if (::syscall(SYS_close_range, 4U, ~0U, 0) != 0) {
    for (int fd = 4; fd < 65536; ++fd) ::close(fd);
  }
  std::array<pid_t, kMaxGroups> groups{};
  std::size_t count = 0;
  std::int32_t value = 0;
  while (read_message(3, value)) {
    if (value > 0 && count < groups.size()) {
      groups[count++] = value;
    } else if (value < 0) {
      for (std::size_t i = 0; i < count; ++i) {
        if (groups[i] == -value) {
          groups[i] = groups[--count];
          break;
        }
      }
    }
  }
  for (std::size_t i = 0; i < count; ++i) ::kill(-groups[i], SIGKILL);
  ::_exit(0);
}

}  // namespace

GroupReaper::GroupReaper() {
  int ends[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ends) != 0) {
    throw std::system_error(errno, std::generic_category(), "group guard: socketpair");
  }
  UniqueFd agent_end(ends[0]);
  UniqueFd guard_end(ends[1]);
  pid_ = ::fork();
  if (pid_ < 0) throw std::system_error(errno, std::generic_category(), "group guard: fork");
  if (pid_ == 0) guard_main(guard_end.get());
  channel_ = std::move(agent_end);
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
