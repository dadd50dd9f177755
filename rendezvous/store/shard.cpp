#include "shard.hpp"

#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <future>

#include "shard_loop.hpp"
#include "sharded_connection.hpp"

namespace ddp::store {
namespace {

using boost::asio::ip::tcp;

// The socketpair's send buffer: bounds the sockets in flight to a shard (each counts against
// the sender's RLIMIT_NOFILE while in flight) to a few dozen.
constexpr int kPairSendBuffer = 32 * 1024;

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
  const int fd = socket.native_handle();
  const ssize_t n = send_socket(pair_.native_handle(), id, fd);
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
