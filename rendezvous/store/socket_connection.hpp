#pragma once
// A connection whose socket is in the server's own descriptor table, read and written on the
// server's loop: the connection of every server that stays under its descriptor limit.

#include <boost/asio/ip/tcp.hpp>
#include <memory>
#include <string>

#include "connection.hpp"

namespace ddp::store {

class SocketConnection final : public Connection {
 public:
  SocketConnection(std::shared_ptr<Server::Impl> server, boost::asio::ip::tcp::socket socket,
                   std::string peer);

  void start() override { on_readable(); }

 private:
  void send_queued() override;
  void close_socket() override;
  void resume_reading() override { on_readable(); }

  void on_readable();
  void wait_readable();
  void on_written(const boost::system::error_code& ec);

  boost::asio::ip::tcp::socket socket_;
  std::string sending_;  // replies being written
};

}  // namespace ddp::store
