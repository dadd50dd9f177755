#pragma once
// A plain blocking TCP socket for tests that send bytes no well-behaved client would.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <string_view>

namespace ddp::test {

class RawSocket {
 public:
  // Connects to 127.0.0.1:port from source (a loopback address such as "127.0.0.2"; empty:
  // the kernel picks, 127.0.0.1) and source_port (0: the kernel picks; else the connection
  // holds that port as its own end, as another program's connection can).
  explicit RawSocket(std::uint16_t port, const std::string& source = "",
                     std::uint16_t source_port = 0) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) throw std::runtime_error("socket() failed");
    if (!source.empty() || source_port != 0) {
      const std::string address = source.empty() ? "127.0.0.1" : source;
      sockaddr_in local{};
      local.sin_family = AF_INET;
      local.sin_port = htons(source_port);
      if (::inet_pton(AF_INET, address.c_str(), &local.sin_addr) != 1 ||
          ::bind(fd_, reinterpret_cast<sockaddr*>(&local), sizeof(local)) != 0) {
        ::close(fd_);
        throw std::runtime_error("cannot bind a socket to " + address + ":" +
                                 std::to_string(source_port));
      }
    }
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      ::close(fd_);
      throw std::runtime_error("connect to 127.0.0.1:" + std::to_string(port) + " failed");
    }
    int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  ~RawSocket() { close(); }
  RawSocket(const RawSocket&) = delete;
  RawSocket& operator=(const RawSocket&) = delete;
  RawSocket(RawSocket&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }

  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  // Closes with a reset (SO_LINGER 0): no TIME_WAIT, so the local port is free at once.
  void reset() {
    if (fd_ < 0) return;
    const linger no_time_wait{1, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_LINGER, &no_time_wait, sizeof no_time_wait);
    close();
  }

  // False when the peer has closed (the send may still succeed once after a close).
  bool send(std::string_view bytes) {
    while (!bytes.empty()) {
      ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      bytes.remove_prefix(static_cast<std::size_t>(n));
    }
    return true;
  }

  // Exactly n bytes, or what arrived before the timeout or the peer's close.
  std::string read(std::size_t n, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    std::string out;
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (out.size() < n) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
      char buf[4096];
      ssize_t got = ::recv(fd_, buf, std::min(sizeof(buf), n - out.size()), 0);
      if (got <= 0) break;
      out.append(buf, static_cast<std::size_t>(got));
    }
    return out;
  }

  // True when the peer closes the connection within timeout (reads and drops any bytes).
  bool closed_by_peer(std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) return false;
      char buf[4096];
      ssize_t got = ::recv(fd_, buf, sizeof(buf), 0);
      if (got <= 0) return true;
    }
  }

  int fd() const { return fd_; }

 private:
  int fd_ = -1;
};

}  // namespace ddp::test
