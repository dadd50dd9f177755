// The floor for ddpstore-bench's mix: a server that keeps no store and parses nothing. It
// answers each read with the reply size the mix expects next (1, 40, 8 bytes, in turn), so
// its CPU time per request is what one recv + one send + epoll cost on this machine, the
// part any TCPStore server pays. 1.x dialect only (no VALIDATE to skip).

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

constexpr std::size_t kReplySizes[] = {1, 8 + 32, 8};  // WAIT, GET, ADD

int listen_on_loopback(std::uint16_t& port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(fd, 4096) != 0) {
    throw std::runtime_error("floor server: cannot listen on 127.0.0.1:" + std::to_string(port));
  }
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  port = ntohs(addr.sin_port);
  return fd;
}

}  // namespace

namespace ddp::bench {

// Serves until killed.
int run_floor_server(std::uint16_t port) {
  int listener = listen_on_loopback(port);
  std::cout << "listening on 127.0.0.1:" << port << std::endl;
  int ep = ::epoll_create1(EPOLL_CLOEXEC);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = listener;
  ::epoll_ctl(ep, EPOLL_CTL_ADD, listener, &ev);
  std::vector<int> step(1 << 16, 0);  // per fd: which reply comes next
  const std::string zeros(64, '\0');
  std::vector<epoll_event> events(1024);
  char buffer[64 * 1024];
  for (;;) {
    int n = ::epoll_wait(ep, events.data(), static_cast<int>(events.size()), -1);
    for (int i = 0; i < n; ++i) {
      int fd = events[i].data.fd;
      if (fd == listener) {
        int c = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
        if (c < 0 || c >= static_cast<int>(step.size())) continue;
        int one = 1;
        ::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        step[c] = 0;
        epoll_event cev{};
        cev.events = EPOLLIN;
        cev.data.fd = c;
        ::epoll_ctl(ep, EPOLL_CTL_ADD, c, &cev);
        continue;
      }
      ssize_t got = ::recv(fd, buffer, sizeof(buffer), 0);
      if (got <= 0) {
        ::close(fd);
        continue;
      }
      ::send(fd, zeros.data(), kReplySizes[step[fd]], MSG_NOSIGNAL);
      step[fd] = (step[fd] + 1) % 3;
    }
  }
}

}  // namespace ddp::bench
