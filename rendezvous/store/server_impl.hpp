#pragma once
// The server's shared state: the acceptor, the table, the open connections and the
// connection shards. Private to the rendezvous library. Connections and pending handlers
// hold it by shared_ptr, so it outlives a Server destroyed while handlers are still queued
// on the io_context.

#include <array>
#include <atomic>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <memory>
#include <unordered_map>
#include <vector>

#include "ddp/store/refusal_log.hpp"
#include "ddp/store/server.hpp"
#include "shard.hpp"
#include "store_table.hpp"

namespace ddp::store {

class Connection;

struct Server::Impl : std::enable_shared_from_this<Server::Impl> {
  Impl(boost::asio::io_context& io, ServerOptions options);

  void start_accept();
  void on_accepted(boost::asio::ip::tcp::socket socket);
  // Accepts again, unless a shard holds sockets back (then resume_accept() does).
  void continue_accepting();
  // After accept failed for want of descriptors (EMFILE): frees the spares, accepts the
  // connection into one and hands it to a shard, then keeps the spares again. False without
  // spares (before any shard started) or when the accept fails all the same.
  bool accept_on_spares();
  // Holds kSpareDescriptors open once a shard has started (none before).
  void keep_spares();
  // Serves, refuses or holds a just-accepted socket, as options.admission says.
  void admit(boost::asio::ip::tcp::socket socket);
  void adopt(boost::asio::ip::tcp::socket socket);
  // Whether socket's descriptor is in the part of this process's table kept for the rest of
  // the program: then its connection is served by a shard.
  bool beyond_own_table(boost::asio::ip::tcp::socket& socket) const;
  // A shard that can take one more connection, started if none can; null when shards cannot
  // start here (logged once).
  std::shared_ptr<Shard> shard_with_room();
  // Accepts again after shards took the sockets they held back.
  void resume_accept();
  void refuse(boost::asio::ip::tcp::socket socket, const std::string& why);
  void set_admission(Admission admission);
  void remove(Connection* connection);
  void close();
  void log(std::string_view line) const;

  boost::asio::io_context& io;
  ServerOptions options;
  boost::asio::ip::tcp::acceptor acceptor;
  boost::asio::steady_timer accept_retry;
  std::uint16_t port = 0;
  bool closed = false;
  bool accept_paused = false;  // a shard holds sockets back: let the backlog hold the rest
  StoreTable table;
  std::unordered_map<Connection*, std::shared_ptr<Connection>> connections;
  std::vector<boost::asio::ip::tcp::socket> held;  // unread until admission is decided
  RefusalLog refusals;
  // Threads with their own descriptor tables serving connections beyond this process's
  // table (shard.hpp), started as it fills up, in order; stopped by close().
  std::vector<std::shared_ptr<Shard>> shards;
  bool shards_unavailable = false;     // shards cannot start here: serve in this table only
  bool shard_start_failed = false;     // the last start failed (logged once until one starts)
  bool own_table_full = false;         // accept_on_spares() is adopting: a shard's connection
  std::vector<int> spare_descriptors;  // kept from the first shard's start on
  // Every connection reads into this one buffer: the loop is single-threaded and a
  // connection consumes what it read before returning to the loop.
  std::array<char, 64 * 1024> read_buffer{};

  std::atomic<std::int64_t> open_connections{0};
  std::atomic<std::int64_t> pending_waits{0};
  std::atomic<std::int64_t> keys{0};
  std::atomic<std::int64_t> accepted{0};
  std::atomic<std::int64_t> rejected{0};
  std::atomic<std::int64_t> refused{0};
  std::atomic<std::int64_t> held_count{0};
  std::atomic<std::int64_t> requests{0};
  std::atomic<std::int64_t> shard_count{0};
  std::atomic<std::int64_t> shard_connections{0};
  std::atomic<std::int64_t> stored_bytes{0};
  // Replies queued in every connection (each adds what it holds beyond what it told).
  std::atomic<std::int64_t> queued_reply_bytes{0};
};

}  // namespace ddp::store
