#include "shard.hpp"

#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <boost/asio/write.hpp>
#include <cerrno>
#include <cstring>
#include <future>
#include <mutex>
#include <optional>

#include "ddp/store/store.hpp"
#include "sharded_connection.hpp"

namespace ddp::store {

using boost::asio::ip::tcp;

// What the server's loop asks of a shard.
struct ShardCommand {
  enum class Kind : std::uint8_t { kRead, kWrite, kClose, kStop };
  Kind kind;
  std::uint64_t id = 0;
  std::string bytes;  // kWrite: what to write
};

// What a shard tells the server's loop.
struct ShardEvent {
  enum class Kind : std::uint8_t { kReceived, kSent, kClosed, kFailed };
  Kind kind;
  std::uint64_t id = 0;
  std::string bytes;  // kReceived: what was read; kClosed, kFailed: why, unless an ordinary end
};

// The two queues between the server's loop and one shard. It holds no descriptor, so either
// thread may be the one to destroy it.
struct ShardChannel {
  // Each push returns whether the queue was empty: then the pusher rings the doorbell (the
  // taker empties the queue after reading its doorbells, so no item is left unrung).
  bool push(ShardCommand command) {
    std::lock_guard lock(command_mutex);
    commands.push_back(std::move(command));
    return commands.size() == 1;
  }
  bool push(ShardEvent event) {
    std::lock_guard lock(event_mutex);
    events.push_back(std::move(event));
    return events.size() == 1;
  }
  // Swaps the queue into `into` (cleared first), so that both keep their capacity.
  void take(std::vector<ShardCommand>& into) {
    into.clear();
    std::lock_guard lock(command_mutex);
    std::swap(into, commands);
  }
  void take(std::vector<ShardEvent>& into) {
    into.clear();
    std::lock_guard lock(event_mutex);
    std::swap(into, events);
  }

  std::mutex command_mutex;
  std::vector<ShardCommand> commands;
  std::mutex event_mutex;
  std::vector<ShardEvent> events;
};

namespace {

// Descriptors of a shard's table that are not connections: stdio, its end of the socketpair,
// its event loop's, and a margin.
constexpr std::size_t kShardOwnDescriptors = 32;
// The socketpair's send buffer: bounds the sockets in flight to a shard (each counts against
// the sender's RLIMIT_NOFILE while in flight) to a few dozen.
constexpr int kPairSendBuffer = 32 * 1024;
// Read at most this much from one socket per read the server's loop asked for.
constexpr std::size_t kShardReadBytes = 64 * 1024;
// A socketpair message that only wakes the other side; others carry a connection's id.
constexpr std::uint64_t kDoorbell = 0;

void ring_on(int fd) {
  const std::uint64_t bell = kDoorbell;
  ::send(fd, &bell, sizeof bell, MSG_DONTWAIT | MSG_NOSIGNAL);
}

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
      std::uint64_t id = kDoorbell;
      iovec data{&id, sizeof id};
      alignas(cmsghdr) std::array<char, CMSG_SPACE(sizeof(int))> control{};
      msghdr message{};
      message.msg_iov = &data;
      message.msg_iovlen = 1;
      message.msg_control = control.data();
      message.msg_controllen = control.size();
      const ssize_t n = ::recvmsg(pair_.native_handle(), &message, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;  // nothing more (or the server's end is closed: it stops us next)
      int fd = -1;
      for (cmsghdr* c = CMSG_FIRSTHDR(&message); c != nullptr; c = CMSG_NXTHDR(&message, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
          std::memcpy(&fd, CMSG_DATA(c), sizeof fd);
        }
      }
      if (id == kDoorbell) {
        if (fd >= 0) ::close(fd);
        continue;
      }
      if (fd < 0) {
        const bool full = (message.msg_flags & MSG_CTRUNC) != 0;
        post(ShardEvent{ShardEvent::Kind::kClosed, id,
                        full ? "the connection shard's descriptor table was full"
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
void keep_only(int keep) {
  const auto k = static_cast<unsigned>(keep);
  bool done = true;
  if (k <= 2) {
    done = ::close_range(3, ~0U, 0) == 0;
  } else {
    if (k > 3) done = ::close_range(3, k - 1, 0) == 0;
    done = done && ::close_range(k + 1, ~0U, 0) == 0;
  }
  if (done) return;
  const long highest = ::sysconf(_SC_OPEN_MAX);  // no close_range (before Linux 5.9)
  for (long fd = 3; fd < highest; ++fd) {
    if (fd != keep) ::close(static_cast<int>(fd));
  }
}

// How a shard's thread started: empty error when it runs.
struct ShardStart {
  std::string error;
  bool unsupported = false;  // never will here (unshare refused)
};

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

}  // namespace

std::size_t descriptor_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) {
    return static_cast<std::size_t>(::sysconf(_SC_OPEN_MAX));
  }
  return static_cast<std::size_t>(limit.rlim_cur);
}

Shard::Shard(boost::asio::io_context& io, int index, ShardHooks hooks)
    : io_(io),
      index_(index),
      hooks_(std::move(hooks)),
      channel_(std::make_shared<ShardChannel>()),
      pair_(io) {}

Shard::~Shard() { stop(); }

std::shared_ptr<Shard> Shard::start(boost::asio::io_context& io, int index, ShardHooks hooks) {
  const std::string name = "connection shard " + std::to_string(index);
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, pair) != 0) {
    throw StoreError("cannot start " + name + ": socketpair: " + std::strerror(errno));
  }
  const int send_buffer = kPairSendBuffer;
  ::setsockopt(pair[0], SOL_SOCKET, SO_SNDBUF, &send_buffer, sizeof send_buffer);
  auto shard = std::make_shared<Shard>(io, index, std::move(hooks));
  boost::system::error_code ec;
  shard->pair_.assign(pair[0], ec);
  if (ec) {
    ::close(pair[0]);
    ::close(pair[1]);
    throw StoreError("cannot start " + name + ": " + ec.message());
  }
  std::promise<ShardStart> ready;
  std::future<ShardStart> started = ready.get_future();
  try {
    shard->thread_ = std::thread(run_shard, shard->channel_, pair[1], std::move(ready));
  } catch (const std::system_error& e) {
    ::close(pair[1]);
    throw StoreError("cannot start " + name + ": " + e.what());
  }
  // Not a wait on the network: the thread only unshares its table and closes the copies.
  const ShardStart start = started.get();
  ::close(pair[1]);  // the shard keeps its own copy, in its own table
  if (!start.error.empty()) {
    shard->thread_.join();
    const std::string what = "cannot start " + name + ": " + start.error;
    if (start.unsupported) throw ShardsUnsupported(what);
    throw StoreError(what);
  }
  const std::size_t limit = descriptor_limit();
  shard->capacity_ = limit > 2 * kShardOwnDescriptors ? limit - kShardOwnDescriptors : 0;
  shard->wait_events();
  return shard;
}

void Shard::adopt(std::uint64_t id, ShardedConnection& connection, tcp::socket socket) {
  connections_.emplace(id, &connection);
  ++live_;
  if (unsent_.empty()) {
    const Handover handover = send_descriptor(id, socket);
    if (handover == Handover::kSent) return;
    if (handover == Handover::kFailed) return lost(id, handover_error(errno));
  }
  unsent_.emplace_back(id, std::move(socket));
  wait_writable();
}

std::string Shard::handover_error(int error) const {
  return "cannot hand the connection to connection shard " + std::to_string(index_) + ": " +
         std::strerror(error);
}

Shard::Handover Shard::send_descriptor(std::uint64_t id, tcp::socket& socket) {
  iovec data{&id, sizeof id};
  alignas(cmsghdr) std::array<char, CMSG_SPACE(sizeof(int))> control{};
  msghdr message{};
  message.msg_iov = &data;
  message.msg_iovlen = 1;
  message.msg_control = control.data();
  message.msg_controllen = control.size();
  cmsghdr* header = CMSG_FIRSTHDR(&message);
  header->cmsg_level = SOL_SOCKET;
  header->cmsg_type = SCM_RIGHTS;
  header->cmsg_len = CMSG_LEN(sizeof(int));
  const int fd = socket.native_handle();
  std::memcpy(CMSG_DATA(header), &fd, sizeof fd);
  ssize_t n = 0;
  do {
    n = ::sendmsg(pair_.native_handle(), &message, MSG_DONTWAIT | MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK ? Handover::kFull : Handover::kFailed;
  // Out of this loop's reactor first: close() alone would leave it registered there while
  // the shard holds the socket, and every event of it would wake this loop.
  boost::system::error_code ignored;
  socket.release(ignored);
  ::close(fd);  // the message holds the socket until the shard takes it
  return Handover::kSent;
}

void Shard::wait_writable() {
  if (waiting_writable_ || stopped_) return;
  waiting_writable_ = true;
  pair_.async_wait(boost::asio::posix::stream_descriptor::wait_write,
                   [self = shared_from_this()](const boost::system::error_code& ec) {
                     self->waiting_writable_ = false;
                     if (ec || self->stopped_) return;
                     self->send_unsent();
                   });
}

void Shard::send_unsent() {
  while (!unsent_.empty()) {
    auto& [id, socket] = unsent_.front();
    const Handover handover = send_descriptor(id, socket);
    if (handover == Handover::kFull) return wait_writable();
    const std::uint64_t failed = id;
    const int error = errno;
    unsent_.pop_front();
    if (handover == Handover::kFailed) lost(failed, handover_error(error));
  }
  if (hooks_.on_drained) hooks_.on_drained();
}

void Shard::write(std::uint64_t id, std::string bytes) {
  push(ShardCommand{ShardCommand::Kind::kWrite, id, std::move(bytes)});
}

void Shard::read(std::uint64_t id) { push(ShardCommand{ShardCommand::Kind::kRead, id, {}}); }

void Shard::close(std::uint64_t id) {
  connections_.erase(id);
  for (auto it = unsent_.begin(); it != unsent_.end(); ++it) {
    if (it->first != id) continue;
    unsent_.erase(it);  // never left this table: closed here
    --live_;
    return;
  }
  push(ShardCommand{ShardCommand::Kind::kClose, id, {}});
}

void Shard::push(ShardCommand command) {
  if (stopped_) return;
  if (channel_->push(std::move(command))) ring();
}

void Shard::ring() { ring_on(pair_.native_handle()); }

void Shard::wait_events() {
  pair_.async_wait(boost::asio::posix::stream_descriptor::wait_read,
                   [self = shared_from_this()](const boost::system::error_code& ec) {
                     if (ec || self->stopped_) return;
                     self->on_events();
                   });
}

// Reads the doorbells first, then takes the events: an event pushed meanwhile rings again.
void Shard::on_events() {
  std::uint64_t bell = 0;
  while (::recv(pair_.native_handle(), &bell, sizeof bell, MSG_DONTWAIT) > 0) {
  }
  channel_->take(events_);
  for (ShardEvent& event : events_) {
    dispatch(event);
    if (stopped_) return;
  }
  wait_events();
}

void Shard::dispatch(ShardEvent& event) {
  if (event.kind == ShardEvent::Kind::kFailed) {
    stopped_ = true;  // its thread has ended, and its sockets with it
    if (hooks_.log) {
      hooks_.log("connection shard " + std::to_string(index_) + " failed (" + event.bytes +
                 "); its " + std::to_string(connections_.size()) + " connection(s) are closed");
    }
    auto lost_ids = std::move(connections_);
    connections_.clear();
    for (auto& [id, connection] : lost_ids) {
      auto keep = connection->shared_from_this();
      connection->on_socket_closed({});
    }
    return;
  }
  if (event.kind == ShardEvent::Kind::kClosed) return lost(event.id, event.bytes);
  auto it = connections_.find(event.id);
  if (it == connections_.end()) return;        // closed on this side meanwhile
  auto keep = it->second->shared_from_this();  // it may close while it handles the event
  auto* connection = static_cast<ShardedConnection*>(keep.get());
  if (event.kind == ShardEvent::Kind::kReceived) {
    connection->on_received(event.bytes);
  } else {
    connection->on_sent();
  }
}

void Shard::lost(std::uint64_t id, const std::string& note) {
  --live_;
  auto it = connections_.find(id);
  if (it == connections_.end()) return;
  auto keep = it->second->shared_from_this();
  connections_.erase(it);
  static_cast<ShardedConnection*>(keep.get())->on_socket_closed(note);
}

void Shard::stop() {
  if (stopped_ && !thread_.joinable()) return;
  if (!stopped_ && thread_.joinable()) {
    channel_->push(ShardCommand{ShardCommand::Kind::kStop, 0, {}});
    ring();
  }
  stopped_ = true;
  if (thread_.joinable()) thread_.join();
  unsent_.clear();
  connections_.clear();
  boost::system::error_code ignored;
  pair_.close(ignored);
}

}  // namespace ddp::store
