#pragma once
// One client connection of the store server: a small state machine that reads whatever
// bytes arrive, reassembles requests, answers them in order and batches its writes.
// Private to the rendezvous library; lives on the server's event loop thread.

#include <boost/asio/ip/tcp.hpp>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "server_impl.hpp"
#include "store_table.hpp"

namespace ddp::store {

class Connection final : public Subscriber, public std::enable_shared_from_this<Connection> {
 public:
  Connection(std::shared_ptr<Server::Impl> server, boost::asio::ip::tcp::socket socket,
             std::string peer);

  // Starts reading. The server keeps the connection in its list until close().
  void start() { on_readable(); }

  // Drops pending waits and watches and closes the socket. A non-empty reason is logged
  // with the peer and counted as a rejection. Idempotent.
  void close(std::string_view reason = {});

  void on_wait_done(Waiter& waiter) override;
  void on_key_event(std::uint8_t event, std::string_view key, std::string_view old_value,
                    std::string_view new_value) override;

 private:
  void on_readable();
  // Cancels every pending wait of this connection: O(waits), whatever their keys.
  void cancel_waits();
  void wait_readable();
  bool process(const char* data, std::size_t size);
  // Answers one request; returns false after closing the connection for it.
  bool handle(Request& request);
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
  // Hands queued replies to the socket and accounts for what is left.
  void flush();
  void send_queued();
  void on_written(const boost::system::error_code& ec);
  // Replies queued or being written.
  std::size_t backlog() const { return out_.size() + sending_.size(); }

  std::shared_ptr<Server::Impl> server_;
  boost::asio::ip::tcp::socket socket_;
  std::string peer_;
  RequestParser parser_;
  std::string out_;            // replies not yet handed to the socket
  std::string sending_;        // replies being written
  std::size_t accounted_ = 0;  // backlog() as last added to the server's total
  bool writing_ = false;
  bool read_paused_ = false;  // too much output queued: stop reading until it drains
  bool closed_ = false;
  bool closing_ = false;  // a close is posted: push nothing more
  std::string unread_;    // bytes read but not yet handled when the backlog grew too large
  // Pending waits, by address: the table answers with a reference, removed in O(1).
  std::unordered_map<const Waiter*, std::unique_ptr<Waiter>> waiters_;
  std::vector<std::string> watched_;
};

}  // namespace ddp::store
