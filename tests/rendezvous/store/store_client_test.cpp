// Client timeouts against servers that misbehave on purpose.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <thread>

#include "ddp/store/client.hpp"

using namespace ddp::store;
using namespace std::chrono_literals;

namespace {

// A 1.x "server" on 127.0.0.1 that answers the first request it gets with `reply`, one byte
// every `pause`, then holds the connection open until destroyed.
class Dribbler {
 public:
  Dribbler(std::string reply, std::chrono::milliseconds pause) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
        ::listen(listen_fd_, 1) != 0 ||
        ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      throw std::runtime_error("Dribbler: cannot listen on 127.0.0.1");
    }
    port_ = ntohs(addr.sin_port);
    // Errors end the thread quietly: the test's assertions are about the client.
    thread_ = std::thread([this, reply = std::move(reply), pause] {
      int fd = ::accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) return;
      client_fd_ = fd;
      char request = 0;
      if (::recv(fd, &request, 1, 0) != 1) return;
      for (char byte : reply) {
        // The pace is the behaviour under test, not a wait for an event.
        std::this_thread::sleep_for(pause);
        if (::send(fd, &byte, 1, MSG_NOSIGNAL) != 1) return;
      }
    });
  }
  ~Dribbler() {
    ::shutdown(listen_fd_, SHUT_RDWR);  // ends an accept still waiting
    thread_.join();
    if (client_fd_ >= 0) ::close(client_fd_);
    ::close(listen_fd_);
  }
  std::uint16_t port() const { return port_; }

 private:
  int listen_fd_ = -1;
  int client_fd_ = -1;
  std::uint16_t port_ = 0;
  std::thread thread_;
};

}  // namespace

TEST_CASE("the client's reply timeout bounds the whole reply, not each byte of it") {
  // GETNUMKEYS' 8-byte reply at one byte per 300 ms: each byte well within the 1 s timeout,
  // the whole reply (2.4 s) not.
  Dribbler server(std::string(8, '\0'), 300ms);
  ClientOptions options;
  options.port = server.port();
  options.dialect = Dialect::V1;
  options.connect_timeout = 10s;
  options.timeout = 1s;
  Client client(options);
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(client.num_keys(), StoreTimeout);
  const auto took = std::chrono::steady_clock::now() - start;
  CHECK(took >= 950ms);
  CHECK(took < 2s);  // the whole reply would have taken 2.4 s
}
