#pragma once
// A connection whose socket lives on a connection shard (shard.hpp), because the server's
// own descriptor table had no room for it. The protocol runs here, on the server's loop,
// exactly as for a SocketConnection; only the bytes travel through the shard.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "connection.hpp"
#include "shard.hpp"

namespace ddp::store {

class ShardedConnection final : public Connection {
 public:
  ShardedConnection(std::shared_ptr<Server::Impl> server, std::string peer,
                    std::shared_ptr<Shard> shard, std::uint64_t id);

  // The shard reads as soon as it holds the socket (Shard::adopt).
  void start() override {}

  // From the shard, on the loop thread: bytes it read (it reads again when asked), the
  // end of a write, and the end of the socket (note: why, unless an ordinary disconnect).
  void on_received(std::string_view bytes);
  void on_sent();
  void on_socket_closed(std::string_view note);

 private:
  void send_queued() override;
  void close_socket() override;
  void resume_reading() override;

  std::shared_ptr<Shard> shard_;
  std::uint64_t id_;
  bool socket_closed_ = false;  // the shard closed it already
};

}  // namespace ddp::store
