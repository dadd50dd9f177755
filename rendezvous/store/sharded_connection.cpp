#include "sharded_connection.hpp"

#include <utility>

namespace ddp::store {

ShardedConnection::ShardedConnection(std::shared_ptr<Server::Impl> server, std::string peer,
                                     std::shared_ptr<Shard> shard, std::uint64_t id)
    : Connection(std::move(server), std::move(peer)), shard_(std::move(shard)), id_(id) {
  ++server_->shard_connections;
}

void ShardedConnection::on_received(std::string_view bytes) {
  if (closed_) return;
  if (!process(bytes.data(), bytes.size())) return;
  resume_reading();
}

// Like SocketConnection::on_readable, one read at a time: handles what is left, sends the
// replies, and asks the shard for the next read unless the output backlog says to pause.
void ShardedConnection::resume_reading() {
  if (!drain_unread()) return;
  flush();
  shard_->read(id_);
}

void ShardedConnection::on_sent() { written({}); }

void ShardedConnection::on_socket_closed(std::string_view note) {
  socket_closed_ = true;
  if (!note.empty()) server_->log("closed connection from " + peer_ + ": " + std::string(note));
  close();
}

void ShardedConnection::send_queued() {
  if (writing_ || out_.empty() || closed_) return;
  writing_ = true;
  in_flight_ = out_.size();
  shard_->write(id_, std::exchange(out_, std::string()));
}

void ShardedConnection::close_socket() {
  --server_->shard_connections;
  if (!socket_closed_) shard_->close(id_);
}

}  // namespace ddp::store
