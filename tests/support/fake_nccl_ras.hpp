#pragma once
// A stand-in for NCCL's RAS service (launcher/diagnosis/nccl_ras.hpp) on a loopback port: it
// answers the handshake, the TIMEOUT and STATUS with a fixed report, then closes, and keeps
// what the client sent for the test to check. One client at a time, until destroyed.

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace ddp::test {

class FakeNcclRas {
 public:
  // answer: what it says to the handshake ("" : nothing, it stays silent).
  explicit FakeNcclRas(std::string report, std::string answer = "SERVER PROTOCOL 2\n")
      : report_(std::move(report)), answer_(std::move(answer)) {
    listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    ::listen(listener_, 8);
    socklen_t size = sizeof addr;
    ::getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &size);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~FakeNcclRas() {
    stop_ = true;
    thread_.join();
    ::close(listener_);
  }

  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

  // Every line clients sent, in order.
  std::vector<std::string> received() const {
    std::lock_guard lock(mutex_);
    return received_;
  }

 private:
  void serve() {
    while (!stop_) {
      pollfd readable{listener_, POLLIN, 0};
      if (::poll(&readable, 1, 50) != 1) continue;
      const int fd = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      converse(fd);
      ::close(fd);
    }
  }

  void converse(int fd) {
    std::string pending;
    char chunk[512];
    while (!stop_) {
      pollfd readable{fd, POLLIN, 0};
      if (::poll(&readable, 1, 50) != 1) continue;
      const ssize_t n = ::recv(fd, chunk, sizeof chunk, 0);
      if (n <= 0) return;
      pending.append(chunk, static_cast<std::size_t>(n));
      for (std::size_t end; (end = pending.find('\n')) != std::string::npos;) {
        const std::string line = pending.substr(0, end);
        pending.erase(0, end + 1);
        {
          std::lock_guard lock(mutex_);
          received_.push_back(line);
        }
        std::string reply;
        if (line.starts_with("CLIENT PROTOCOL")) reply = answer_;
        if (line.starts_with("TIMEOUT")) reply = "OK\n";
        if (line == "STATUS") reply = report_;
        if (!reply.empty()) ::send(fd, reply.data(), reply.size(), MSG_NOSIGNAL);
        if (line == "STATUS") return;  // the report ends with the connection
      }
    }
  }

  std::string report_;
  std::string answer_;
  int listener_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  mutable std::mutex mutex_;
  std::vector<std::string> received_;
  std::thread thread_;
};

}  // namespace ddp::test
