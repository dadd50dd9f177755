#include "shard_loop.hpp"

#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <array>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/write.hpp>
#include <cerrno>
#include <cstring>
#include <optional>
#include <unordered_map>

namespace ddp::store {
namespace {

using boost::asio::ip::tcp;

// Read at most this much from one socket per read the server's loop asked for.
constexpr std::size_t kShardReadBytes = 64 * 1024;

// The shard's thread: its sockets and its event loop, all of its own descriptor table.
class ShardLoop {
 public:
  ShardLoop(std::shared_ptr<ShardChannel> channel, int pair_fd)
      : channel_(std::move(channel)), pair_(io_, pair_fd) {}

  void run() {
    wait_doorbell();
    io_.run();
  }

  // Tells the server's loop that this thread gives up (its sockets close with it).
  void fail(const std::string& why) { post(ShardEvent{ShardEvent::Kind::kFailed, 0, why}); }

 private:
  struct Socket {
    explicit Socket(boost::asio::io_context& io) : socket(io) {}
    tcp::socket socket;
    std::string sending;         // being written
    bool wanted = true;          // the server's loop asked for a read not yet made
    bool maybe_readable = true;  // no read found the socket empty since its last edge
    bool armed = false;          // a wait for readability is pending
  };

  void wait_doorbell() {
    pair_.async_wait(boost::asio::posix::stream_descriptor::wait_read,
                     [this](const boost::system::error_code& ec) {
                       if (ec || stopping_) return;
                       on_doorbell();
                     });
  }

  // Takes the sockets sent so far, then every command queued: a command for a connection
  // always follows its socket on the pair.
  void on_doorbell() {
    take_sockets();
    channel_->take(commands_);
    for (ShardCommand& command : commands_) {
      apply(command);
      if (stopping_) return;
    }
    wait_doorbell();
  }

  void take_sockets() {
    for (;;) {
      ReceivedSocket message;
      if (receive_socket(pair_.native_handle(), message) <= 0) {
        return;  // nothing more (or the server's end is closed: it stops us next)
      }
      const std::uint64_t id = message.id;
      const int fd = message.socket;
      if (id == kDoorbell) {
        if (fd >= 0) ::close(fd);
        continue;
      }
      if (fd < 0) {
        post(ShardEvent{ShardEvent::Kind::kClosed, id,
                        message.truncated ? "the connection shard's descriptor table was full"
                                          : "its socket did not reach the connection shard"});
        continue;
      }
      adopt(id, fd);
    }
  }

  void adopt(std::uint64_t id, int fd) {
    int domain = AF_INET;
    socklen_t size = sizeof domain;
    ::getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &size);
    auto socket = std::make_unique<Socket>(io_);
    boost::system::error_code ec;
    socket->socket.assign(domain == AF_INET6 ? tcp::v6() : tcp::v4(), fd, ec);
    if (!ec) socket->socket.non_blocking(true, ec);
    if (ec) {
      if (!socket->socket.is_open()) ::close(fd);
      post(ShardEvent{ShardEvent::Kind::kClosed, id,
                      "the connection shard could not take its socket: " + ec.message()});
      return;
    }
    Socket& adopted = *socket;
    sockets_.emplace(id, std::move(socket));
    pump(id, adopted);
  }

  // The socket of connection id; sockets still on their way are taken first.
  Socket* find(std::uint64_t id) {
    auto it = sockets_.find(id);
    if (it == sockets_.end()) {
      take_sockets();
      it = sockets_.find(id);
    }
    return it == sockets_.end() ? nullptr : it->second.get();
  }

  void apply(ShardCommand& command) {
    if (command.kind == ShardCommand::Kind::kStop) return stop();
    Socket* socket = find(command.id);
    if (socket == nullptr) return;  // closed here already: the loop has heard or will hear
    switch (command.kind) {
      case ShardCommand::Kind::kRead:
        socket->wanted = true;
        return pump(command.id, *socket);
      case ShardCommand::Kind::kWrite:
        return write(command.id, *socket, std::move(command.bytes));
      case ShardCommand::Kind::kClose:
        return close(command.id);
      case ShardCommand::Kind::kStop:
        return;
    }
  }

  // Reads if the loop wants a read and there may be something; else waits for an edge.
  void pump(std::uint64_t id, Socket& socket) {
    if (!socket.wanted) return;
    if (socket.maybe_readable) return read_now(id, socket);
    arm(id, socket);
  }

  void read_now(std::uint64_t id, Socket& socket) {
    boost::system::error_code ec;
    const std::size_t n = socket.socket.read_some(boost::asio::buffer(buffer_), ec);
    if (ec == boost::asio::error::would_block || ec == boost::asio::error::try_again) {
      socket.maybe_readable = false;
      return arm(id, socket);
    }
    if (ec) return close(id);  // EOF or reset: an ordinary disconnect
    socket.wanted = false;
    // A short read emptied the socket: wait for the next edge now, in the handler that saw
    // it empty (the reactor is edge-triggered), even before the loop asks for more.
    socket.maybe_readable = n == buffer_.size();
    if (!socket.maybe_readable) arm(id, socket);
    post(ShardEvent{ShardEvent::Kind::kReceived, id, std::string(buffer_.data(), n)});
  }

  void arm(std::uint64_t id, Socket& socket) {
    if (socket.armed) return;
    socket.armed = true;
    socket.socket.async_wait(tcp::socket::wait_read,
                             [this, id](const boost::system::error_code& ec) {
                               if (ec == boost::asio::error::operation_aborted) return;
                               auto it = sockets_.find(id);
                               if (it == sockets_.end()) return;
                               Socket& ready = *it->second;
                               ready.armed = false;
                               if (ec) return close(id);
                               ready.maybe_readable = true;
                               pump(id, ready);
                             });
  }

  void write(std::uint64_t id, Socket& socket, std::string bytes) {
    socket.sending = std::move(bytes);
    // Most replies fit the socket buffer; errors are left to the asynchronous write.
    boost::system::error_code ec;
    std::size_t sent = socket.socket.send(boost::asio::buffer(socket.sending), 0, ec);
    if (ec) sent = 0;
    if (sent == socket.sending.size()) {
      socket.sending.clear();
      return post(ShardEvent{ShardEvent::Kind::kSent, id, {}});
    }
    socket.sending.erase(0, sent);
    boost::asio::async_write(socket.socket, boost::asio::buffer(socket.sending),
                             [this, id](const boost::system::error_code& ec, std::size_t) {
                               if (ec == boost::asio::error::operation_aborted) return;
                               auto it = sockets_.find(id);
                               if (it == sockets_.end()) return;
                               if (ec) return close(id);  // the peer went away
                               it->second->sending.clear();
                               post(ShardEvent{ShardEvent::Kind::kSent, id, {}});
                             });
  }

  void close(std::uint64_t id) {
    sockets_.erase(id);  // closes it, here, in this table
    post(ShardEvent{ShardEvent::Kind::kClosed, id, {}});
  }

  void stop() {
    stopping_ = true;
    sockets_.clear();
    boost::system::error_code ignored;
    pair_.close(ignored);
  }

  void post(ShardEvent event) {
    if (channel_->push(std::move(event)) && pair_.is_open()) ring_on(pair_.native_handle());
  }

  boost::asio::io_context io_{1};
  std::shared_ptr<ShardChannel> channel_;
  boost::asio::posix::stream_descriptor pair_;
  std::unordered_map<std::uint64_t, std::unique_ptr<Socket>> sockets_;
  std::vector<ShardCommand> commands_;  // taken from the channel, kept for its capacity
  std::array<char, kShardReadBytes> buffer_{};
  bool stopping_ = false;
};

// Closes every descriptor the thread's new table copied from the process's, except stdio
// (kept, so that a stray write to 2 can never reach a client) and the shard's end of the
// pair. Until this ran, a connection the server closes would stay open through the copy.
// close_range(2) through syscall(): glibc has the wrapper only from 2.34, and the packages
// build against glibc 2.31 (docs/install.md).
bool close_range_of(unsigned first, unsigned last) {
#ifdef SYS_close_range
  return ::syscall(SYS_close_range, first, last, 0u) == 0;
#else
  (void)first;
  (void)last;
  return false;  // headers older than Linux 5.9: the loop below
#endif
}

void keep_only(int keep) {
  const auto k = static_cast<unsigned>(keep);
  bool done = true;
  if (k <= 2) {
    done = close_range_of(3, ~0U);
  } else {
    if (k > 3) done = close_range_of(3, k - 1);
    done = done && close_range_of(k + 1, ~0U);
  }
  if (done) return;
  const long highest = ::sysconf(_SC_OPEN_MAX);  // no close_range (before Linux 5.9)
  for (long fd = 3; fd < highest; ++fd) {
    if (fd != keep) ::close(static_cast<int>(fd));
  }
}

}  // namespace

void run_shard(const std::shared_ptr<ShardChannel>& channel, int pair_fd,
               std::promise<ShardStart> ready) {
  sigset_t all;
  ::sigfillset(&all);
  ::pthread_sigmask(SIG_BLOCK, &all, nullptr);
  if (::unshare(CLONE_FILES) != 0) {
    ready.set_value({std::string("unshare(CLONE_FILES): ") + std::strerror(errno), true});
    return;
  }
  keep_only(pair_fd);
  std::optional<ShardLoop> loop;
  try {
    loop.emplace(channel, pair_fd);
  } catch (const std::exception& e) {
    ::close(pair_fd);
    ready.set_value({std::string("its event loop: ") + e.what()});
    return;
  }
  ready.set_value({});
  try {
    loop->run();
  } catch (const std::exception& e) {
    loop->fail(e.what());
  }
}

}  // namespace ddp::store
