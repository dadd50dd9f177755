#include "ddp/launcher/write_all.hpp"

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>

namespace ddp::launcher {

namespace {
// How long a write waits for a full, non-blocking console (or file) to take more.
constexpr std::chrono::milliseconds kConsoleWriteTimeout{10000};
}  // namespace

std::size_t write_all_counted(int fd, const char* data, std::size_t size, int* error) {
  std::size_t written = 0;
  *error = 0;
  while (written < size) {
    ssize_t n = ::write(fd, data + written, size - written);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {  // a non-blocking console
      pollfd writable{fd, POLLOUT, 0};
      if (::poll(&writable, 1, static_cast<int>(kConsoleWriteTimeout.count())) == 1) continue;
      *error = ETIMEDOUT;
      return written;
    }
    if (n <= 0) {
      *error = n < 0 ? errno : ENOSPC;  // write() returning 0 for a file: no room
      return written;
    }
    written += static_cast<std::size_t>(n);
  }
  return written;
}

bool write_all(int fd, const char* data, std::size_t size) {
  int error = 0;
  write_all_counted(fd, data, size, &error);
  return error == 0;
}

}  // namespace ddp::launcher
