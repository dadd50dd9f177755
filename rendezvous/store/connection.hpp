#pragma once
// One client connection of the store server, as the protocol sees it: reassembles requests
// from whatever bytes arrive, answers them in order against the table, queues the replies
// and keeps the budgets. Where the socket lives is the subclass's: SocketConnection holds it
// in the server's own descriptor table, ShardedConnection on a connection shard (a thread
// with its own table). Private to the rendezvous library; every Connection lives on the
// server's event loop thread, whichever table its socket is in.

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "server_impl.hpp"
#include "store_table.hpp"

namespace ddp::store {

// Stop reading a client that does not read its replies once this much output is queued.
inline constexpr std::size_t kMaxQueuedOutput = 32 * 1024 * 1024;

class Connection : public Subscriber, public std::enable_shared_from_this<Connection> {
 public:
  Connection(std::shared_ptr<Server::Impl> server, std::string peer);
  virtual ~Connection() = default;
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Starts reading. The server keeps the connection in its list until close().
  virtual void start() = 0;

  // Drops pending waits and watches and closes the socket. A non-empty reason is logged
  // with the peer and counted as a rejection. Idempotent.
  void close(std::string_view reason = {});

  void on_wait_done(Waiter& waiter) override;
  void on_key_event(std::uint8_t event, std::string_view key, std::string_view old_value,
                    std::string_view new_value) override;

 protected:
  // The socket's side, called on the loop thread.
  // Hands out_ to the socket unless a write is in flight (writing_); sets writing_ and
  // in_flight_ when part of it is left to an asynchronous write, which ends in written().
  virtual void send_queued() = 0;
  // Closes the socket; called once, by close().
  virtual void close_socket() = 0;
  // Reads again after a pause for output (read_paused_ was cleared).
  virtual void resume_reading() = 0;

  // Handles the requests in data, in order; false after closing the connection.
  bool process(const char* data, std::size_t size);
  // Handles unread_ until it is empty (true) or the output backlog makes reading pause
  // (read_paused_ set) or the connection closed (false).
  bool drain_unread();
  // Hands queued replies to the socket and accounts for what is left.
  void flush();
  // An asynchronous write of in_flight_ bytes ended.
  void written(const boost::system::error_code& ec);
  // Replies queued or being written.
  std::size_t backlog() const { return out_.size() + in_flight_; }

  std::shared_ptr<Server::Impl> server_;
  std::string peer_;
  std::string out_;            // replies not yet handed to the socket
  std::size_t in_flight_ = 0;  // bytes handed to an asynchronous write not yet finished
  bool writing_ = false;
  bool read_paused_ = false;  // too much output queued: stop reading until it drains
  bool closed_ = false;
  std::string unread_;  // bytes read but not yet handled when the backlog grew too large

 private:
  // Cancels every pending wait of this connection: O(waits), whatever their keys.
  void cancel_waits();
  // Answers one request; returns false after closing the connection for it.
  bool handle(Request& request);
  // After a SET or COMPARE_SET of key: the store's reset, when ServerOptions::reset_after_set
  // asks for it.
  void reset_if_asked(std::string_view key);
  bool handle_wait(const Request& request);
  bool handle_multi_get(const Request& request);
  // How much the store would grow at most by handling request.
  std::size_t store_growth(const Request& request) const;
  // False after closing the connection for a request that would outgrow the store budget.
  bool fits_store_budget(const Request& request);
  // Tells the server how many reply bytes this connection holds now.
  void account_output();
  // account_output(); false after closing the connection when the server-wide total is
  // over budget and this connection holds some of it.
  bool within_output_budget();

  RequestParser parser_;
  std::size_t accounted_ = 0;  // backlog() as last added to the server's total
  bool closing_ = false;       // a close is posted: push nothing more
  // Pending waits, by address: the table answers with a reference, removed in O(1).
  std::unordered_map<const Waiter*, std::unique_ptr<Waiter>> waiters_;
  std::vector<std::string> watched_;
};

}  // namespace ddp::store
