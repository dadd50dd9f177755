#pragma once
// The c10d-compatible TCP store server: PyTorch 1.x and 2.x TCPStore clients and our Client
// on one port, the dialect told apart per connection by its first bytes.
//
// Threading: the server lives on the caller's io_context and must only be touched from the
// one thread that runs it (construct it anywhere before run() starts). stats() may be read
// from any thread.
//
// Past the descriptor limit: a connection whose descriptor would take this process's table
// within its last sixteenth (at least 16, at most 1024 descriptors, left to the rest of the
// program) is handed to a connection shard, a thread the server starts with its own
// descriptor table (unshare(CLONE_FILES)) and event loop, each holding up to the soft
// RLIMIT_NOFILE less 32. Shards only read and write sockets; every request is still parsed
// and answered on the caller's loop against the one table, so the store's semantics do not
// change. A program that stays under the limit starts no thread. Shard threads block every
// signal, and close() stops and joins them. Lifetime: the io_context must outlive the Server;
// destroying the Server closes it, so destroy it on the loop's thread or after the loop stopped.
// Handlers still queued on the io_context keep the server's internals alive until they ran or the
// io_context is destroyed.

#include <boost/asio/io_context.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ddp/store/admission.hpp"
#include "ddp/store/store.hpp"
#include "ddp/store/wire_codec.hpp"

namespace ddp::store {

inline constexpr std::size_t kDefaultMaxWaitsPerConnection = 1024;
// Store-wide memory budgets, sized for real jobs (a job stores kilobytes to a few megabytes
// per rank).
inline constexpr std::size_t kDefaultMaxStoredBytes = std::size_t{1} << 30;         // 1 GiB
inline constexpr std::size_t kDefaultMaxQueuedReplyBytes = std::size_t{256} << 20;  // 256 MiB
inline constexpr std::size_t kDefaultMaxHeldConnections = 1024;

// One line per event worth telling an operator (a connection closed for bad bytes).
using Logger = std::function<void(std::string_view line)>;

struct ServerOptions {
  std::string host = "0.0.0.0";  // address to listen on ("127.0.0.1", "::", a hostname)
  std::uint16_t port = 0;        // 0: let the system pick; see Server::port()
  Limits limits;                 // per-request limits; larger requests close the connection
  Logger logger;                 // empty: lines go to stderr prefixed "ddpstore: "
  int backlog = 65535;           // listen backlog (the kernel caps it at somaxconn)
  // WAITs one connection may have pending (real clients have one or two); one more
  // closes that connection.
  std::size_t max_waits_per_connection = kDefaultMaxWaitsPerConnection;
  // Keys, values and queued elements of the whole store. A request that would store more
  // closes its connection; nothing of it is stored.
  std::size_t max_stored_bytes = kDefaultMaxStoredBytes;
  // Replies (and 1.x watch events) queued for all connections and not yet taken by their
  // sockets. The connection whose request takes the total past it is closed.
  std::size_t max_queued_reply_bytes = kDefaultMaxQueuedReplyBytes;
  // Non-empty: an ADD to this key answers the server host's CLOCK_MONOTONIC now, in
  // nanoseconds, so that clients estimate their clock's offset to it (ddprun's job-wide
  // trace). Nothing is stored under it; other commands see an ordinary missing key.
  std::string clock_key;
  // Who may connect (the peer's address, at accept): anyone by default. Refused peers are
  // closed at once, with a line per address at most once a minute (RefusalLog).
  Admission admission = Admission::anyone();
  // Connections held while admission is pending; one more is refused.
  std::size_t max_held_connections = kDefaultMaxHeldConnections;
  // Called on the server's loop after each SET, and each COMPARE_SET, with the key and the
  // value it holds now, before the reply: true erases every key that starts with none of
  // keep_on_reset, at once, before any later request is read. For a store whose other clients
  // come in generations, each one's keys unseen by the next (ddprun's static rendezvous
  // across nodes: PyTorch 2.x no longer puts a restarted attempt's keys under a prefix of
  // their own).
  std::function<bool(std::string_view key, std::string_view value)> reset_after_set;
  std::vector<std::string> keep_on_reset;
};

// The key ddprun's agents serve their clock under (ServerOptions::clock_key).
inline constexpr const char* kClockKey = "ddprun/clock/monotonic_ns";

// Counters for tests and monitoring; safe to read from any thread.
struct ServerStats {
  std::int64_t connections = 0;         // open now
  std::int64_t waits = 0;               // WAIT requests not yet answered
  std::int64_t keys = 0;                // keys stored
  std::int64_t accepted = 0;            // connections accepted since start
  std::int64_t rejected = 0;            // connections closed for a protocol violation
  std::int64_t refused = 0;             // connections closed at accept (ServerOptions::admission)
  std::int64_t held = 0;                // connections held until admission is decided
  std::int64_t requests = 0;            // requests handled since start
  std::int64_t stored_bytes = 0;        // keys, values and queued elements held
  std::int64_t queued_reply_bytes = 0;  // replies waiting for their clients' sockets
  std::int64_t shards = 0;              // connection shards running (Server's comment)
  std::int64_t shard_connections = 0;   // connections open now on shards
};

class Server {
 public:
  // Binds and listens at once; throws StoreError naming host:port when it cannot (a port in
  // use, an unknown host). Starts accepting when the io_context runs.
  Server(boost::asio::io_context& io, ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // The bound port (the one picked when options.port was 0).
  std::uint16_t port() const;
  const std::string& host() const;

  // Stops accepting, closes every connection and joins the shard threads; pending waits are
  // dropped. Idempotent.
  // Call from the io_context's thread (or before it runs / after it stopped).
  void close();

  ServerStats stats() const;

  // Drops every key (values and queues), as if the store were new; connections, pending waits
  // and watches stay. For a store whose clients of a round are all gone before the next round
  // starts (the agent's store on one node: each attempt must not read the last one's keys).
  // Call from the io_context's thread.
  void clear_keys();

  // From now on, admit by admission: connections held so far are judged by it (a pending one
  // keeps holding the peers it does not list); open connections are left alone. Call from
  // the io_context's thread.
  void set_admission(Admission admission);

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace ddp::store
