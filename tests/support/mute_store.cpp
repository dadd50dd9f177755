#include "mute_store.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "ddp/store/wire_codec.hpp"

namespace ddp::test {

using store::Command;

MuteStore::MuteStore() {
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t size = sizeof addr;
  if (listen_fd_ < 0 || ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(listen_fd_, 64) != 0 ||
      ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &size) != 0 ||
      ::pipe2(stop_pipe_, O_CLOEXEC) != 0) {
    throw std::runtime_error("MuteStore: cannot listen on 127.0.0.1");
  }
  port_ = ntohs(addr.sin_port);
  thread_ = std::thread([this] { run(); });
}

MuteStore::~MuteStore() {
  char byte = 0;
  (void)!::write(stop_pipe_[1], &byte, 1);
  thread_.join();
  ::close(listen_fd_);
  ::close(stop_pipe_[0]);
  ::close(stop_pipe_[1]);
}

bool MuteStore::wait_for_unanswered(int n, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  return changed_.wait_for(lock, timeout, [&] { return unanswered_ >= n; });
}

void MuteStore::run() {
  std::map<int, std::unique_ptr<store::RequestParser>> connections;  // by descriptor
  while (true) {
    std::vector<pollfd> fds = {{stop_pipe_[0], POLLIN, 0}, {listen_fd_, POLLIN, 0}};
    for (const auto& [fd, parser] : connections) fds.push_back({fd, POLLIN, 0});
    if (::poll(fds.data(), fds.size(), 1000) < 0) continue;  // EINTR
    if (fds[0].revents != 0) break;
    if (fds[1].revents & POLLIN) {
      int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) {
        connections[fd] =
            std::make_unique<store::RequestParser>(store::Limits{}, store::Dialect::V2);
      }
    }
    for (std::size_t i = 2; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      const int fd = fds[i].fd;
      char buffer[4096];
      ssize_t n = ::read(fd, buffer, sizeof buffer);
      if (n <= 0) {
        ::close(fd);
        connections.erase(fd);
        continue;
      }
      std::string_view data(buffer, static_cast<std::size_t>(n));
      auto& parser = *connections[fd];
      while (!data.empty()) {
        auto result = parser.feed(data);
        data.remove_prefix(result.consumed);
        if (result.status != store::RequestParser::Status::Complete) break;
        const store::Request& request = parser.request();
        if (request.command == Command::Ping) {
          std::string reply;
          store::put_u32(reply, request.u32);
          (void)!::write(fd, reply.data(), reply.size());
        } else if (request.command != Command::Validate) {
          std::lock_guard lock(mutex_);
          ++unanswered_;
          changed_.notify_all();
        }
      }
    }
  }
  for (const auto& [fd, parser] : connections) ::close(fd);
}

}  // namespace ddp::test
