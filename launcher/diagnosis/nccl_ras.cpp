#include "diagnosis/nccl_ras.hpp"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

namespace ddp::launcher {
namespace {

constexpr int kClientProtocol = 2;  // what NCCL 2.24..2.28's ncclras speaks

using Clock = std::chrono::steady_clock;

int ms_left(Clock::time_point deadline) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::max<long long>(left, 0));
}

class Connection {
 public:
  ~Connection() {
    if (fd_ >= 0) ::close(fd_);
  }

  // "" when connected, else why not.
  std::string connect(const std::string& host, const std::string& port,
                      Clock::time_point deadline) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    if (int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0) {
      return std::string("cannot resolve ") + host + ": " + ::gai_strerror(rc);
    }
    std::string why = "no address";
    for (addrinfo* ai = found; ai; ai = ai->ai_next) {
      fd_ =
          ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
      if (fd_ < 0) continue;
      int rc = ::connect(fd_, ai->ai_addr, ai->ai_addrlen);
      if (rc != 0 && errno == EINPROGRESS) {
        pollfd writable{fd_, POLLOUT, 0};
        if (::poll(&writable, 1, ms_left(deadline)) == 1) {
          int error = 0;
          socklen_t size = sizeof error;
          ::getsockopt(fd_, SOL_SOCKET, SO_ERROR, &error, &size);
          rc = error == 0 ? 0 : -1;
          errno = error;
        } else {
          errno = ETIMEDOUT;
        }
      }
      if (rc == 0) break;
      why = std::strerror(errno);
      ::close(fd_);
      fd_ = -1;
    }
    ::freeaddrinfo(found);
    return fd_ >= 0 ? "" : why;
  }

  // "" when all was sent.
  std::string send(const std::string& text, Clock::time_point deadline) {
    std::size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = ::send(fd_, text.data() + done, text.size() - done, MSG_NOSIGNAL);
      if (n > 0) {
        done += static_cast<std::size_t>(n);
        continue;
      }
      if (n < 0 && errno != EAGAIN && errno != EINTR) return std::strerror(errno);
      pollfd writable{fd_, POLLOUT, 0};
      if (::poll(&writable, 1, ms_left(deadline)) != 1) return "timed out sending";
    }
    return "";
  }

  // Reads into buffer_ until it holds a newline (line mode) or the peer closes. "" or why not.
  std::string read(bool until_close, Clock::time_point deadline) {
    for (;;) {
      if (!until_close && buffer_.find('\n') != std::string::npos) return "";
      pollfd readable{fd_, POLLIN, 0};
      if (::poll(&readable, 1, ms_left(deadline)) != 1) return "timed out waiting for an answer";
      char chunk[4096];
      const ssize_t n = ::recv(fd_, chunk, sizeof chunk, 0);
      if (n == 0) return until_close ? "" : "the service closed the connection";
      if (n < 0) {
        if (errno == EAGAIN || errno == EINTR) continue;
        return std::strerror(errno);
      }
      buffer_.append(chunk, static_cast<std::size_t>(n));
      if (buffer_.size() > 1024 * 1024) return until_close ? "" : "an answer line too long";
    }
  }

  // The first line of buffer_, taken out of it (without its newline).
  std::string take_line() {
    const std::size_t end = buffer_.find('\n');
    std::string line = buffer_.substr(0, end);
    buffer_.erase(0, end == std::string::npos ? buffer_.size() : end + 1);
    return line;
  }
  std::string take_all() { return std::exchange(buffer_, std::string()); }

 private:
  int fd_ = -1;
  std::string buffer_;
};

}  // namespace

NcclRasStatus query_nccl_ras(const std::string& address, std::chrono::milliseconds timeout) {
  NcclRasStatus status;
  const auto deadline = Clock::now() + timeout;
  std::string host = address, port = "28028";
  if (address.starts_with('[')) {  // [v6]:port
    const std::size_t close = address.find(']');
    host = address.substr(1, close == std::string::npos ? std::string::npos : close - 1);
    if (close != std::string::npos && address.compare(close + 1, 1, ":") == 0) {
      port = address.substr(close + 2);
    }
  } else if (const std::size_t colon = address.find(':');
             colon != std::string::npos && address.find(':', colon + 1) == std::string::npos) {
    host = address.substr(0, colon);
    port = address.substr(colon + 1);
  }
  Connection connection;
  auto fail = [&](const std::string& why) {
    status.error = why;
    return status;
  };
  if (auto why = connection.connect(host, port, deadline); !why.empty()) return fail(why);
  if (auto why =
          connection.send("CLIENT PROTOCOL " + std::to_string(kClientProtocol) + "\n", deadline);
      !why.empty()) {
    return fail(why);
  }
  if (auto why = connection.read(false, deadline); !why.empty()) return fail(why);
  if (const std::string line = connection.take_line(); !line.starts_with("SERVER PROTOCOL ")) {
    return fail("not NCCL's RAS service: it answered \"" + line.substr(0, 80) + "\"");
  }
  // RAS waits this long for the other processes' answers; ours ends a few seconds later.
  const int ras_wait_s = static_cast<int>(std::max<long long>(1, timeout.count() / 1000 - 3));
  if (auto why = connection.send("TIMEOUT " + std::to_string(ras_wait_s) + "\n", deadline);
      !why.empty()) {
    return fail(why);
  }
  if (auto why = connection.read(false, deadline); !why.empty()) return fail(why);
  if (const std::string line = connection.take_line(); line != "OK") {
    return fail("RAS refused the timeout: \"" + line.substr(0, 80) + "\"");
  }
  if (auto why = connection.send("STATUS\n", deadline); !why.empty()) return fail(why);
  const std::string why = connection.read(true, deadline);
  status.report = connection.take_all();
  if (!why.empty() && status.report.empty()) return fail(why);
  status.answered = true;
  if (!why.empty()) status.report += "\n(cut short: " + why + ")";
  return status;
}

}  // namespace ddp::launcher
