#include "socket_connection.hpp"

#include <boost/asio/write.hpp>
#include <utility>

namespace ddp::store {
namespace {

// Keep at most this much write buffer capacity between bursts.
constexpr std::size_t kKeptOutputCapacity = 256 * 1024;

}  // namespace

SocketConnection::SocketConnection(std::shared_ptr<Server::Impl> server,
                                   boost::asio::ip::tcp::socket socket, std::string peer)
    : Connection(std::move(server), std::move(peer)), socket_(std::move(socket)) {}

void SocketConnection::close_socket() {
  boost::system::error_code ignored;
  socket_.close(ignored);
}

// Reads until the socket has nothing more (the reactor is edge-triggered), handling each
// complete request as it arrives, then sends the batched replies and waits for more. Bytes
// left unhandled when the backlog grew too large (unread_) are handled first.
void SocketConnection::on_readable() {
  auto& buffer = server_->read_buffer;
  for (;;) {
    if (closed_) return;
    bool drained = false;
    if (!unread_.empty()) {
      std::string pending = std::exchange(unread_, std::string());
      if (!process(pending.data(), pending.size())) return;
    } else {
      boost::system::error_code ec;
      std::size_t n = socket_.read_some(boost::asio::buffer(buffer), ec);
      if (ec == boost::asio::error::would_block || ec == boost::asio::error::try_again) break;
      if (ec) {
        close();  // EOF or reset: an ordinary disconnect
        return;
      }
      if (!process(buffer.data(), n)) return;
      drained = n < buffer.size();  // the next arrival raises a new edge
    }
    if (backlog() > kMaxQueuedOutput) {
      flush();
      if (writing_) {  // the socket is full: read again once the write drained
        read_paused_ = true;
        return;
      }
    }
    if (drained && unread_.empty()) break;
  }
  flush();
  wait_readable();
}

void SocketConnection::wait_readable() {
  socket_.async_wait(boost::asio::ip::tcp::socket::wait_read,
                     [self = std::static_pointer_cast<SocketConnection>(shared_from_this())](
                         const boost::system::error_code& ec) {
                       if (ec || self->closed_) return;
                       self->on_readable();
                     });
}

void SocketConnection::send_queued() {
  if (writing_ || out_.empty() || closed_) return;
  // Most replies fit the socket buffer: send at once and skip the event loop. Errors are
  // left to the asynchronous write below, so that a connection never closes in the middle
  // of another one's wake-ups.
  boost::system::error_code ec;
  std::size_t sent = socket_.send(boost::asio::buffer(out_), 0, ec);
  if (ec) sent = 0;
  if (sent == out_.size()) {
    out_.clear();
    return;
  }
  out_.erase(0, sent);
  writing_ = true;
  std::swap(out_, sending_);
  in_flight_ = sending_.size();
  boost::asio::async_write(
      socket_, boost::asio::buffer(sending_),
      [self = std::static_pointer_cast<SocketConnection>(shared_from_this())](
          const boost::system::error_code& ec, std::size_t) { self->on_written(ec); });
}

void SocketConnection::on_written(const boost::system::error_code& ec) {
  if (!closed_ && !ec) {
    sending_.clear();
    if (sending_.capacity() > kKeptOutputCapacity) std::string().swap(sending_);
  }
  written(ec);
}

}  // namespace ddp::store
