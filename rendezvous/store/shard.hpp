#pragma once
// A connection shard: a thread with its own descriptor table (unshare(CLONE_FILES)) and its
// own event loop, holding the sockets of connections the server's table has no room for.
// It only moves bytes between those sockets and the server's loop: requests are parsed and
// answered there (ShardedConnection), so the store keeps its one table thread and with it
// its semantics.
//
// The two tables share one descriptor: a socketpair made before the thread unshared. It
// carries each socket handed over (SCM_RIGHTS, with its connection's id) and one-message
// doorbells both ways; commands and events go through two mutex-guarded queues. No
// descriptor number of one table is ever used on the other thread, and no object holding a
// descriptor is destroyed there (which is also why asio's post is not used between them: it
// would write the other table's eventfd number).
//
// Threading: every member function is for the server's loop thread. The shard's thread
// blocks every signal, so that handlers (asio's signal_set writes to a pipe of the server's
// table) always run on a thread of the process's own table.

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ddp/store/store.hpp"

namespace ddp::store {

class ShardedConnection;
struct ShardChannel;
struct ShardCommand;
struct ShardEvent;

// Shard::start's error when this process cannot have shards at all (unshare refused, no
// threads); a plain StoreError is a passing want of descriptors.
class ShardsUnsupported : public StoreError {
 public:
  using StoreError::StoreError;
};

// The soft RLIMIT_NOFILE: how many descriptors one table may hold.
std::size_t descriptor_limit();

// What a shard tells the server's loop beside its connections' bytes.
struct ShardHooks {
  std::function<void()> on_drained;                // sockets held back (backed_up()) all went
  std::function<void(std::string_view line)> log;  // a line for the operator
};

class Shard : public std::enable_shared_from_this<Shard> {
 public:
  // Starts shard number `index` and waits until its thread has its own table. Throws
  // ShardsUnsupported when shards cannot run here, StoreError when this table has no room
  // for the socketpair.
  static std::shared_ptr<Shard> start(boost::asio::io_context& io, int index, ShardHooks hooks);
  ~Shard();
  Shard(const Shard&) = delete;
  Shard& operator=(const Shard&) = delete;

  int index() const { return index_; }
  // Connections this shard may still take without its table overflowing.
  bool has_room() const { return !stopped_ && live_ < capacity_; }
  std::size_t capacity() const { return capacity_; }
  // Sockets waiting for room in the socketpair: stop accepting until on_drained.
  bool backed_up() const { return !unsent_.empty(); }

  // An id for the next connection handed to this shard.
  std::uint64_t new_id() { return next_id_++; }
  // Hands socket (of this server's table, closed here once sent) to the shard as connection
  // id; the shard reads it at once. What it reads and how it ends go to connection.
  void adopt(std::uint64_t id, ShardedConnection& connection, boost::asio::ip::tcp::socket socket);
  // Writes bytes to the connection's socket; ShardedConnection::on_sent follows. One write
  // at a time per connection.
  void write(std::uint64_t id, std::string bytes);
  // Reads once more (at most one read's worth): ShardedConnection::on_received follows.
  void read(std::uint64_t id);
  // Closes the connection's socket; the connection hears nothing more from the shard.
  void close(std::uint64_t id);
  // Closes every socket of the shard and joins its thread. Idempotent.
  void stop();

  // For make_shared only; use start().
  Shard(boost::asio::io_context& io, int index, ShardHooks hooks);

 private:
  enum class Handover { kSent, kFull, kFailed };

  void push(ShardCommand command);
  // One doorbell message on the socketpair (never blocks: a full pair wakes the shard anyway).
  void ring();
  // Sends socket's descriptor with its id and closes it here when it went.
  Handover send_descriptor(std::uint64_t id, boost::asio::ip::tcp::socket& socket);
  std::string handover_error(int error) const;
  void wait_writable();
  void send_unsent();
  void wait_events();
  void on_events();
  void dispatch(ShardEvent& event);
  // The connection's socket is gone (note: why, when that is not an ordinary end).
  void lost(std::uint64_t id, const std::string& note);

  boost::asio::io_context& io_;
  int index_;
  ShardHooks hooks_;
  std::shared_ptr<ShardChannel> channel_;
  boost::asio::posix::stream_descriptor pair_;  // this table's end of the socketpair
  std::thread thread_;
  std::size_t capacity_ = 0;
  std::size_t live_ = 0;  // sockets handed over (or waiting to be) and not yet closed there
  std::uint64_t next_id_ = 1;
  bool stopped_ = false;
  bool waiting_writable_ = false;
  std::unordered_map<std::uint64_t, ShardedConnection*> connections_;
  std::deque<std::pair<std::uint64_t, boost::asio::ip::tcp::socket>> unsent_;
  std::vector<ShardEvent> events_;  // taken from the channel, kept for its capacity
};

}  // namespace ddp::store
