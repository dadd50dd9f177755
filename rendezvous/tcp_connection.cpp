#include "tcp_connection.hpp"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

namespace ddp::store {
namespace {

constexpr std::size_t kReadBuffer = 64 * 1024;
// Back-off between connection attempts: doubles from the first to the last.
constexpr std::chrono::milliseconds kFirstBackoff{10};
constexpr std::chrono::milliseconds kLastBackoff{1000};

std::chrono::milliseconds remaining(TcpConnection::Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - TcpConnection::Clock::now());
  return std::max(left, std::chrono::milliseconds(0));
}

// One attempt at one address; returns the connected fd or -1 with errno set.
int try_connect(const addrinfo& ai, TcpConnection::Clock::time_point deadline) {
  int fd = ::socket(ai.ai_family, ai.ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai.ai_protocol);
  if (fd < 0) return -1;
  if (::connect(fd, ai.ai_addr, ai.ai_addrlen) != 0) {
    if (errno != EINPROGRESS) {
      int saved = errno;
      ::close(fd);
      errno = saved;
      return -1;
    }
    pollfd p{fd, POLLOUT, 0};
    int ready = ::poll(&p, 1, static_cast<int>(std::max<long>(remaining(deadline).count(), 1)));
    int err = 0;
    socklen_t len = sizeof(err);
    if (ready <= 0) {
      err = ready == 0 ? ETIMEDOUT : errno;
    } else if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) {
      err = errno;
    }
    if (err != 0) {
      ::close(fd);
      errno = err;
      return -1;
    }
  }
  int flags = ::fcntl(fd, F_GETFL);
  ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

}  // namespace

std::unique_ptr<TcpConnection> TcpConnection::connect(const std::string& host, std::uint16_t port,
                                                      Clock::time_point deadline,
                                                      std::string& error) {
  auto backoff = kFirstBackoff;
  for (;;) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* list = nullptr;
    int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &list);
    if (rc != 0) {
      error = std::string("cannot resolve host: ") + ::gai_strerror(rc);
    } else {
      for (addrinfo* ai = list; ai; ai = ai->ai_next) {
        int fd = try_connect(*ai, deadline);
        if (fd >= 0) {
          ::freeaddrinfo(list);
          return std::make_unique<TcpConnection>(fd);
        }
        error = std::strerror(errno);
      }
      ::freeaddrinfo(list);
    }
    auto left = remaining(deadline);
    if (left.count() == 0) return nullptr;
    // A retry back-off: the server may not be listening yet.
    std::this_thread::sleep_for(std::min(backoff, left));
    backoff = std::min(backoff * 2, kLastBackoff);
  }
}

TcpConnection::TcpConnection(int fd) : fd_(fd), buffer_(kReadBuffer) {}

TcpConnection::~TcpConnection() { ::close(fd_); }

bool TcpConnection::set_timeout(int option, std::chrono::milliseconds timeout,
                                std::chrono::milliseconds& cached) {
  timeout = std::max(timeout, std::chrono::milliseconds(1));  // 0 would mean "forever"
  if (timeout == cached) return true;
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000);
  if (::setsockopt(fd_, SOL_SOCKET, option, &tv, sizeof(tv)) != 0) {
    errno_ = errno;
    return false;
  }
  cached = timeout;
  return true;
}

TcpConnection::Io TcpConnection::send_all(std::string_view data, std::chrono::milliseconds timeout) {
  if (!set_timeout(SO_SNDTIMEO, timeout, send_timeout_)) return Io::Error;
  while (!data.empty()) {
    ssize_t n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return Io::Timeout;
      errno_ = errno;
      return errno == EPIPE || errno == ECONNRESET ? Io::Closed : Io::Error;
    }
    data.remove_prefix(static_cast<std::size_t>(n));
  }
  return Io::Ok;
}

TcpConnection::Io TcpConnection::read(char* dst, std::size_t n, Clock::time_point deadline) {
  while (n > 0) {
    if (begin_ < end_) {
      std::size_t take = std::min(n, end_ - begin_);
      std::memcpy(dst, buffer_.data() + begin_, take);
      begin_ += take;
      dst += take;
      n -= take;
      continue;
    }
    pollfd p{fd_, POLLIN, 0};
    int ready = ::poll(&p, 1, static_cast<int>(remaining(deadline).count()));
    if (ready < 0) {
      if (errno == EINTR) continue;
      errno_ = errno;
      return Io::Error;
    }
    if (ready == 0) return Io::Timeout;
    // Large reads go straight to the destination.
    char* into = n >= buffer_.size() ? dst : buffer_.data();
    std::size_t room = n >= buffer_.size() ? n : buffer_.size();
    ssize_t got = ::recv(fd_, into, room, MSG_DONTWAIT);
    if (got < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      errno_ = errno;
      return errno == ECONNRESET ? Io::Closed : Io::Error;
    }
    if (got == 0) return Io::Closed;
    if (into == dst) {
      dst += got;
      n -= static_cast<std::size_t>(got);
    } else {
      begin_ = 0;
      end_ = static_cast<std::size_t>(got);
    }
  }
  return Io::Ok;
}

std::string TcpConnection::last_error() const { return std::strerror(errno_); }

}  // namespace ddp::store
