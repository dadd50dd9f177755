#include "ddp/store/server.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/ip/tcp.hpp>
#include <iostream>

#include "server_impl.hpp"
#include "sharded_connection.hpp"
#include "socket_connection.hpp"

namespace ddp::store {
namespace {

using boost::asio::ip::tcp;

// After a failed accept (out of file descriptors), try again after this pause.
constexpr std::chrono::milliseconds kAcceptRetryDelay{100};

// Descriptors of this process's table that connections leave to the rest of the program (an
// agent's workers' pipes, log files): a sixteenth of the soft limit, at least 16, at most
// 1024. Connections beyond go to shards.
std::size_t kept_descriptors(std::size_t limit) {
  return std::clamp<std::size_t>(limit / 16, 16, 1024);
}

// Descriptors held open once shards have started, to be freed when the table is full after
// all (the program took the part kept for it): room to accept one connection and, if need
// be, to start the shard that takes it.
constexpr std::size_t kSpareDescriptors = 3;

std::string endpoint_name(const std::string& host, std::uint16_t port) {
  bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

tcp::endpoint resolve_listen(boost::asio::io_context& io, const std::string& host,
                             std::uint16_t port) {
  tcp::resolver resolver(io);
  boost::system::error_code ec;
  auto results = resolver.resolve(host, std::to_string(port),
                                  tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec || results.empty()) {
    throw StoreError("store server: cannot listen on " + endpoint_name(host, port) +
                     ": cannot resolve host '" + host + "': " + ec.message());
  }
  return results.begin()->endpoint();
}

}  // namespace

Server::Impl::Impl(boost::asio::io_context& io_context, ServerOptions opts)
    : io(io_context), options(std::move(opts)), acceptor(io_context), accept_retry(io_context) {
  const std::string where = endpoint_name(options.host, options.port);
  tcp::endpoint endpoint = resolve_listen(io, options.host, options.port);
  boost::system::error_code ec;
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(options.backlog, ec);
  if (ec) {
    std::string hint;
    if (ec == boost::asio::error::address_in_use) {
      hint =
          "; another process holds this port: stop it, or pick another port (0 picks a free one)";
    } else if (ec == boost::asio::error::access_denied) {
      hint = "; ports below 1024 need privileges: pick a higher port";
    } else if (ec == boost::system::errc::address_not_available) {
      hint = "; this machine has no such address: listen on one of its own addresses or 0.0.0.0";
    }
    throw StoreError("store server: cannot listen on " + where + ": " + ec.message() + hint);
  }
  acceptor.non_blocking(true, ec);
  port = acceptor.local_endpoint().port();
}

void Server::Impl::log(std::string_view line) const {
  if (options.logger) {
    options.logger(line);
  } else {
    std::cerr << "ddpstore: " << line << std::endl;
  }
}

void Server::Impl::start_accept() {
  acceptor.async_accept(
      [self = shared_from_this()](const boost::system::error_code& ec, tcp::socket socket) {
        if (self->closed) return;
        if (ec == boost::asio::error::operation_aborted) return;
        if (!ec) return self->on_accepted(std::move(socket));
        if (ec == boost::asio::error::no_descriptors && self->accept_on_spares()) return;
        self->log("accept failed: " + ec.message() + "; retrying in " +
                  std::to_string(kAcceptRetryDelay.count()) + " ms");
        self->accept_retry.expires_after(kAcceptRetryDelay);
        self->accept_retry.async_wait([self](const boost::system::error_code& timer_ec) {
          if (!timer_ec && !self->closed) self->start_accept();
        });
      });
}

void Server::Impl::on_accepted(tcp::socket socket) {
  admit(std::move(socket));
  continue_accepting();
}

void Server::Impl::continue_accepting() {
  keep_spares();
  for (const auto& shard : shards) {
    if (shard->backed_up()) {  // resume_accept() follows
      accept_paused = true;
      return;
    }
  }
  start_accept();
}

bool Server::Impl::accept_on_spares() {
  if (spare_descriptors.empty()) return false;
  for (int fd : spare_descriptors) ::close(fd);
  spare_descriptors.clear();
  boost::system::error_code ec;
  tcp::socket socket(io);
  acceptor.accept(socket, ec);  // the connection that met the full table (or it went away)
  if (!ec) {
    own_table_full = true;  // whatever its number, it goes to a shard
    admit(std::move(socket));
    own_table_full = false;
  }
  if (ec && ec != boost::asio::error::would_block && ec != boost::asio::error::try_again) {
    keep_spares();
    return false;
  }
  continue_accepting();  // keeps the spares again first
  return true;
}

void Server::Impl::keep_spares() {
  if (shards.empty()) return;  // a server that never needed a shard keeps nothing extra
  while (spare_descriptors.size() < kSpareDescriptors) {
    const int fd = ::eventfd(0, EFD_CLOEXEC);
    if (fd < 0) return;
    spare_descriptors.push_back(fd);
  }
}

void Server::Impl::admit(tcp::socket socket) {
  if (options.admission.admits_anyone()) return adopt(std::move(socket));
  boost::system::error_code ec;
  auto remote = socket.remote_endpoint(ec);
  if (ec) return;  // gone already (reset before we looked): nothing to serve or refuse
  switch (options.admission.judge(remote.address())) {
    case Admission::Verdict::kAdmit:
      return adopt(std::move(socket));
    case Admission::Verdict::kRefuse:
      return refuse(std::move(socket), options.admission.why());
    case Admission::Verdict::kHold:
      if (held.size() >= options.max_held_connections) {
        return refuse(std::move(socket), "already holding " + std::to_string(held.size()) +
                                             " connection(s) until this store learns who "
                                             "may connect");
      }
      held.push_back(std::move(socket));
      held_count = static_cast<std::int64_t>(held.size());
      return;
  }
}

void Server::Impl::refuse(tcp::socket socket, const std::string& why) {
  boost::system::error_code ec;
  auto remote = socket.remote_endpoint(ec);
  socket.close(ec);
  if (auto line =
          refusals.refused(remote.address().to_string(), why, std::chrono::steady_clock::now())) {
    log(*line);
  }
  ++refused;  // after the line: a reader of stats() finds it logged
}

void Server::Impl::set_admission(Admission admission) {
  options.admission = std::move(admission);
  auto waiting = std::move(held);
  held.clear();
  held_count = 0;
  for (tcp::socket& socket : waiting) admit(std::move(socket));
}

void Server::Impl::adopt(tcp::socket socket) {
  boost::system::error_code ec;
  socket.set_option(tcp::no_delay(true), ec);
  socket.non_blocking(true, ec);
  auto remote = socket.remote_endpoint(ec);
  std::string peer =
      ec ? "unknown peer" : endpoint_name(remote.address().to_string(), remote.port());
  if (beyond_own_table(socket)) {
    if (auto shard = shard_with_room()) {
      const std::uint64_t id = shard->new_id();
      auto connection =
          std::make_shared<ShardedConnection>(shared_from_this(), std::move(peer), shard, id);
      connections.emplace(connection.get(), connection);
      ++accepted;
      ++open_connections;
      shard->adopt(id, *connection, std::move(socket));
      return;
    }
  }
  auto connection =
      std::make_shared<SocketConnection>(shared_from_this(), std::move(socket), std::move(peer));
  connections.emplace(connection.get(), connection);
  ++accepted;
  ++open_connections;
  connection->start();
}

bool Server::Impl::beyond_own_table(tcp::socket& socket) const {
  if (shards_unavailable) return false;
  if (own_table_full) return true;
  // Descriptors are numbered lowest free first: this one's number is at least the count of
  // descriptors open below it.
  const std::size_t limit = descriptor_limit();
  const auto fd = static_cast<std::size_t>(socket.native_handle());
  return fd + kept_descriptors(limit) >= limit;
}

std::shared_ptr<Shard> Server::Impl::shard_with_room() {
  for (const auto& shard : shards) {
    if (shard->has_room()) return shard;
  }
  const int index = static_cast<int>(shards.size()) + 1;
  ShardHooks hooks;
  hooks.on_drained = [weak = weak_from_this()] {
    if (auto self = weak.lock()) self->resume_accept();
  };
  hooks.log = [weak = weak_from_this()](std::string_view line) {
    if (auto self = weak.lock()) self->log(line);
  };
  try {
    auto shard = Shard::start(io, index, std::move(hooks));
    shards.push_back(shard);
    shard_start_failed = false;
    keep_spares();
    shard_count = static_cast<std::int64_t>(shards.size());
    const std::size_t limit = descriptor_limit();
    log(std::to_string(open_connections.load()) +
        " connections open and this process's descriptor table near its limit of " +
        std::to_string(limit) + ": started connection shard " + std::to_string(index) +
        ", a thread with its own descriptor table, for up to " + std::to_string(shard->capacity()) +
        " more");
    return shard;
  } catch (const ShardsUnsupported& e) {
    log(std::string(e.what()) +
        "; further connections are served in this process's own descriptor table");
    shards_unavailable = true;
    return nullptr;
  } catch (const StoreError& e) {  // out of descriptors for its socketpair: maybe later
    if (!shard_start_failed) {
      log(std::string(e.what()) + "; serving in this process's own descriptor table meanwhile");
    }
    shard_start_failed = true;
    return nullptr;
  }
}

void Server::Impl::resume_accept() {
  if (!accept_paused || closed) return;
  accept_paused = false;
  continue_accepting();
}

void Server::Impl::remove(Connection* connection) {
  if (connections.erase(connection) > 0) --open_connections;
}

void Server::Impl::close() {
  if (closed) return;
  closed = true;
  boost::system::error_code ignored;
  acceptor.close(ignored);
  accept_retry.cancel();
  for (int fd : spare_descriptors) ::close(fd);
  spare_descriptors.clear();
  for (tcp::socket& socket : held) socket.close(ignored);
  held.clear();
  held_count = 0;
  auto open = std::move(connections);
  connections.clear();
  for (auto& [raw, connection] : open) {
    connection->close();
    --open_connections;
  }
  for (const auto& shard : shards) shard->stop();  // after the connections told them to close
  shards.clear();
  shard_count = 0;
}

Server::Server(boost::asio::io_context& io, ServerOptions options)
    : impl_(std::make_shared<Impl>(io, std::move(options))) {
  impl_->start_accept();
}

Server::~Server() { impl_->close(); }

std::uint16_t Server::port() const { return impl_->port; }
const std::string& Server::host() const { return impl_->options.host; }

void Server::close() { impl_->close(); }

void Server::set_admission(Admission admission) { impl_->set_admission(std::move(admission)); }

void Server::clear_keys() {
  impl_->table.clear_values();
  impl_->keys.store(0, std::memory_order_relaxed);
}

ServerStats Server::stats() const {
  ServerStats s;
  s.connections = impl_->open_connections.load();
  s.waits = impl_->pending_waits.load();
  s.keys = impl_->keys.load();
  s.accepted = impl_->accepted.load();
  s.rejected = impl_->rejected.load();
  s.refused = impl_->refused.load();
  s.held = impl_->held_count.load();
  s.requests = impl_->requests.load();
  s.stored_bytes = impl_->stored_bytes.load();
  s.queued_reply_bytes = impl_->queued_reply_bytes.load();
  s.shards = impl_->shard_count.load();
  s.shard_connections = impl_->shard_connections.load();
  return s;
}

}  // namespace ddp::store
