#include "ddp/store/async_client.hpp"

#include <algorithm>
#include <array>
#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <deque>
#include <optional>
#include <stdexcept>

#include "ddp/store/store_util.hpp"

namespace ddp::store {
namespace {

using boost::asio::ip::tcp;
using Clock = std::chrono::steady_clock;

// Back-off between connection attempts: doubles from the first to the last.
constexpr std::chrono::milliseconds kFirstBackoff{10};
constexpr std::chrono::milliseconds kLastBackoff{1000};
// The 2.x handshake gets what is left of connect_timeout, but at least this long.
constexpr std::chrono::milliseconds kMinHandshakeTimeout{1000};
// How long a canceled wait waits for the server's WAIT_CANCELED.
constexpr std::chrono::milliseconds kCancelReplyTimeout{5000};
constexpr std::size_t kReadChunk = 64 * 1024;

std::string endpoint_of(const std::string& host, std::uint16_t port) {
  bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

std::string ms_text(std::chrono::milliseconds ms) { return std::to_string(ms.count()) + " ms"; }

std::chrono::milliseconds until(Clock::time_point deadline) {
  return std::max(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()),
                  std::chrono::milliseconds(0));
}

struct Operation {
  Request request;
  std::string op;
  std::chrono::milliseconds timeout{0};
  Clock::time_point deadline;
  AsyncClient::ReplyHandler done;
};

}  // namespace

struct AsyncClient::Impl : std::enable_shared_from_this<AsyncClient::Impl> {
  enum class State { Disconnected, Connecting, Handshaking, Ready };

  Impl(boost::asio::io_context& io_context, ClientOptions opts)
      : io(io_context),
        options(std::move(opts)),
        endpoint(endpoint_of(options.host, options.port)),
        socket(io_context),
        resolver(io_context),
        connect_deadline_timer(io_context),
        backoff_timer(io_context),
        reply_timer(io_context),
        parser(options.limits) {}

  std::exception_ptr error(std::string_view op, std::string_view detail, bool timeout) const {
    std::string message =
        "store client " + endpoint + ": " + std::string(op) + ": " + std::string(detail);
    if (timeout) return std::make_exception_ptr(StoreTimeout(message));
    return std::make_exception_ptr(StoreError(message));
  }

  // ---- connecting ----------------------------------------------------------------------

  void start_connect() {
    state = State::Connecting;
    ++generation;
    connect_started = Clock::now();
    connect_deadline = connect_started + options.connect_timeout;
    backoff = kFirstBackoff;
    last_error = "none yet";
    connect_deadline_timer.expires_at(connect_deadline);
    connect_deadline_timer.async_wait(
        [self = shared_from_this(), gen = generation](const boost::system::error_code& ec) {
          if (ec || gen != self->generation || self->state != State::Connecting) return;
          self->connect_expired = true;
          self->resolver.cancel();
          self->backoff_timer.cancel();
          boost::system::error_code ignored;
          self->socket.close(ignored);
        });
    connect_expired = false;
    attempt();
  }

  void attempt() {
    resolver.async_resolve(
        options.host, std::to_string(options.port),
        [self = shared_from_this(), gen = generation](const boost::system::error_code& ec,
                                                      tcp::resolver::results_type results) {
          if (gen != self->generation) return;
          if (ec) {
            self->attempt_failed("cannot resolve host '" + self->options.host +
                                 "': " + ec.message());
            return;
          }
          self->connect_to(results);
        });
  }

  void connect_to(const tcp::resolver::results_type& results) {
    boost::asio::async_connect(socket, results,
                               [self = shared_from_this(), gen = generation](
                                   const boost::system::error_code& ec, const tcp::endpoint&) {
                                 if (gen != self->generation) return;
                                 if (ec) {
                                   boost::system::error_code ignored;
                                   self->socket.close(ignored);
                                   self->attempt_failed(ec.message());
                                   return;
                                 }
                                 self->on_connected();
                               });
  }

  // A refused or unreachable attempt: the server may not be listening yet.
  void attempt_failed(std::string why) {
    if (!connect_expired) last_error = std::move(why);
    if (connect_expired || Clock::now() >= connect_deadline) {
      fail_connect(error("connect",
                         "no store server answered within " + ms_text(options.connect_timeout) +
                             " (last error: " + last_error + ")",
                         false));
      return;
    }
    backoff_timer.expires_after(std::min(backoff, until(connect_deadline)));
    backoff = std::min(backoff * 2, kLastBackoff);
    backoff_timer.async_wait(
        [self = shared_from_this(), gen = generation](const boost::system::error_code& ec) {
          if (gen != self->generation) return;
          if (ec) {
            self->attempt_failed(self->last_error);  // the connect deadline passed
            return;
          }
          self->attempt();
        });
  }

  void on_connected() {
    boost::system::error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);
    start_reading();
    if (dialect == Dialect::V1) {
      on_ready();
      return;
    }
    // 2.x: VALIDATE, then a PING whose nonce must come back; part of connecting, so bounded
    // by connect_timeout (but never less than kMinHandshakeTimeout), not by timeout.
    state = State::Handshaking;
    const auto limit =
        std::min(options.timeout, std::max(until(connect_deadline), kMinHandshakeTimeout));
    const std::uint32_t nonce = ++nonces;
    Operation ping{make_request(Command::Ping, {}, {}, 0, nonce), "connect (PING)", limit,
                   Clock::now() + limit,
                   [self = shared_from_this(), nonce](std::exception_ptr e, Reply reply) {
                     if (!e && reply.u32 != nonce) {
                       e = self->error("connect (PING)", "the server answered a wrong nonce",
                                       false);
                     }
                     if (e) {
                       self->fail_connect(e);
                       return;
                     }
                     self->on_ready();
                   }};
    std::string prefix;
    encode_request(Dialect::V2, make_request(Command::Validate, {}, {}, 0, kValidationMagic),
                   prefix);
    send(std::move(ping), std::move(prefix));
  }

  void on_ready() {
    connect_deadline_timer.cancel();
    state = State::Ready;
    auto waiting = std::exchange(connect_waiters, {});
    for (auto& done : waiting) done(nullptr);
    start_next();
  }

  // Connecting failed: tell whoever waits for the connection, and fail the queued requests
  // (each would only wait connect_timeout again).
  void fail_connect(std::exception_ptr e) {
    drop_connection();
    auto waiting = std::exchange(connect_waiters, {});
    auto queued = std::exchange(queue, {});
    for (auto& done : waiting) done(e);
    for (auto& op : queued) op.done(e, {});
  }

  // ---- requests ------------------------------------------------------------------------

  void submit(Operation op) {
    queue.push_back(std::move(op));
    if (state == State::Disconnected) {
      start_connect();
      return;
    }
    start_next();
  }

  void start_next() {
    if (state != State::Ready || in_flight || queue.empty()) return;
    Operation op = std::move(queue.front());
    queue.pop_front();
    send(std::move(op), {});
  }

  // Writes prefix (requests without replies, such as VALIDATE) and op's request, and makes
  // op the request in flight.
  void send(Operation op, std::string prefix) {
    out = std::move(prefix);
    encode_request(dialect, op.request, out);
    const Command command = op.request.command;
    parser.expect(command, op.request.key_count);
    awaiting_reply = has_reply(command);
    in_flight = std::move(op);
    const std::uint64_t id = ++op_id;
    canceling = false;
    writing = true;
    arm_timer(in_flight->deadline);
    boost::asio::async_write(socket, boost::asio::buffer(out),
                             [self = shared_from_this(), gen = generation, id](
                                 const boost::system::error_code& ec, std::size_t) {
                               if (gen != self->generation || id != self->op_id || !self->in_flight)
                                 return;
                               self->writing = false;
                               if (ec) {
                                 self->fail_connection(ec == boost::asio::error::operation_aborted
                                                           ? "the connection was closed"
                                                           : "send failed: " + ec.message(),
                                                       false);
                                 return;
                               }
                               if (!self->awaiting_reply) self->complete({});
                             });
  }

  void arm_timer(Clock::time_point deadline) {
    reply_timer.expires_at(deadline);
    reply_timer.async_wait([self = shared_from_this(), gen = generation,
                            id = ++timer_id](const boost::system::error_code& ec) {
      if (ec || gen != self->generation || id != self->timer_id || !self->in_flight) return;
      self->on_deadline();
    });
  }

  void on_deadline() {
    const Request& r = in_flight->request;
    if (r.command == Command::Wait) {
      const std::string detail = "timed out after " + ms_text(in_flight->timeout) +
                                 " waiting for " + describe_keys(r.keys);
      if (dialect == Dialect::V2 && !canceling) {  // cancel it, keep the connection
        cancel_wait(detail);
        return;
      }
      fail_connection(canceling ? "cancel wait: timed out after " + ms_text(kCancelReplyTimeout) +
                                      " waiting for WAIT_CANCELED"
                                : detail,
                      true);
      return;
    }
    fail_connection("timed out after " + ms_text(in_flight->timeout) + " waiting for the reply",
                    true);
  }

  // 2.x: CANCEL_WAIT, then read until WAIT_CANCELED (a racing STOP_WAITING may come first).
  void cancel_wait(std::string detail) {
    if (writing) {  // the WAIT itself is not sent yet: nothing to cancel on this stream
      fail_connection(detail, true);
      return;
    }
    canceling = true;
    cancel_detail = std::move(detail);
    parser.expect(Command::CancelWait);
    out.clear();
    encode_request(dialect, make_request(Command::CancelWait), out);
    arm_timer(Clock::now() + kCancelReplyTimeout);
    boost::asio::async_write(socket, boost::asio::buffer(out),
                             [self = shared_from_this(), gen = generation](
                                 const boost::system::error_code& ec, std::size_t) {
                               if (ec && gen == self->generation && self->in_flight) {
                                 self->fail_connection("cancel wait: send failed: " + ec.message(),
                                                       false);
                               }
                             });
  }

  // The request in flight succeeded (or its wait was canceled: a StoreTimeout).
  void complete(std::exception_ptr e) {
    reply_timer.cancel();
    Operation op = std::move(*in_flight);
    in_flight.reset();
    canceling = false;
    op.done(e, std::move(parser.reply()));
    start_next();
  }

  // Drops the connection and fails the request in flight with detail; queued requests
  // reconnect.
  void fail_connection(const std::string& detail, bool timeout) {
    std::optional<Operation> op = std::move(in_flight);
    in_flight.reset();
    drop_connection();
    if (op) op->done(error(op->op, detail, timeout), {});
    if (!queue.empty() && state == State::Disconnected) start_connect();
  }

  void drop_connection() {
    ++generation;  // every handler still queued for the old connection does nothing
    state = State::Disconnected;
    boost::system::error_code ignored;
    resolver.cancel();
    socket.close(ignored);
    connect_deadline_timer.cancel();
    backoff_timer.cancel();
    reply_timer.cancel();
    in_flight.reset();
    writing = false;
    awaiting_reply = false;
  }

  // ---- replies -------------------------------------------------------------------------

  void start_reading() {
    socket.async_read_some(boost::asio::buffer(read_buffer),
                           [self = shared_from_this(), gen = generation](
                               const boost::system::error_code& ec, std::size_t n) {
                             if (gen != self->generation) return;
                             if (ec) {
                               self->on_read_error(ec);
                               return;
                             }
                             if (self->on_bytes(std::string_view(self->read_buffer.data(), n))) {
                               self->start_reading();
                             }
                           });
  }

  void on_read_error(const boost::system::error_code& ec) {
    const bool eof = ec == boost::asio::error::eof || ec == boost::asio::error::connection_reset;
    if (!in_flight && state == State::Ready) {  // idle: reconnect on the next request
      drop_connection();
      return;
    }
    fail_connection(eof ? "the connection closed before the answer came: the store's process "
                          "exited (or was killed), or the store rejected the request (then it "
                          "logs why)"
                        : "receive failed: " + ec.message(),
                    false);
  }

  // Feeds the bytes to the reply in flight; false when the connection was dropped.
  bool on_bytes(std::string_view data) {
    const auto gen = generation;
    while (!data.empty()) {
      if (!in_flight || !awaiting_reply) {
        fail_connection(
            "the server sent " + std::to_string(data.size()) + " bytes that answer no request",
            false);
        return false;
      }
      auto result = parser.feed(data);
      data.remove_prefix(result.consumed);
      if (result.status == ReplyParser::Status::Error) {
        fail_connection(parser.error(), false);
        return false;
      }
      if (result.status == ReplyParser::Status::NeedMore) break;
      on_reply();
      if (gen != generation) return false;  // a handler closed the connection
    }
    return true;
  }

  void on_reply() {
    if (!canceling) {
      if (in_flight->request.command == Command::Wait && parser.reply().code != kStopWaiting) {
        fail_connection("unexpected wait reply " + std::to_string(parser.reply().code), false);
        return;
      }
      complete(nullptr);
      return;
    }
    if (parser.reply().code == kStopWaiting) {  // the wait was answered before the cancel
      parser.expect(Command::CancelWait);
      return;
    }
    complete(error(in_flight->op, cancel_detail, true));
  }

  boost::asio::io_context& io;
  ClientOptions options;
  std::string endpoint;
  Dialect dialect = Dialect::V2;
  tcp::socket socket;
  tcp::resolver resolver;
  boost::asio::steady_timer connect_deadline_timer;
  boost::asio::steady_timer backoff_timer;
  boost::asio::steady_timer reply_timer;
  ReplyParser parser;
  State state = State::Disconnected;
  std::uint64_t generation = 0;  // one per connection (attempt): stale handlers see a change
  std::uint64_t timer_id = 0;
  Clock::time_point connect_started;
  Clock::time_point connect_deadline;
  std::chrono::milliseconds backoff = kFirstBackoff;
  bool connect_expired = false;
  std::string last_error;
  std::vector<ConnectHandler> connect_waiters;
  std::deque<Operation> queue;
  std::optional<Operation> in_flight;
  bool canceling = false;
  std::string cancel_detail;
  std::uint32_t nonces = 0;
  std::uint64_t op_id = 0;      // the request in flight, for its write's completion
  bool awaiting_reply = false;  // the request in flight has a reply still to come
  bool writing = false;         // its bytes are not all written yet
  std::string out;
  std::array<char, kReadChunk> read_buffer{};
};

AsyncClient::AsyncClient(boost::asio::io_context& io, ClientOptions options) {
  if (!options.dialect) {
    throw std::invalid_argument("AsyncClient needs a dialect: probe with detect_dialect() first");
  }
  const Dialect dialect = *options.dialect;
  impl_ = std::make_shared<Impl>(io, std::move(options));
  impl_->dialect = dialect;
}

AsyncClient::~AsyncClient() { close(); }

void AsyncClient::connect(ConnectHandler done) {
  if (impl_->state == Impl::State::Ready) {
    boost::asio::post(impl_->io, [done = std::move(done)] { done(nullptr); });
    return;
  }
  impl_->connect_waiters.push_back(std::move(done));
  if (impl_->state == Impl::State::Disconnected) impl_->start_connect();
}

void AsyncClient::request(Request request, std::string op, std::chrono::milliseconds timeout,
                          ReplyHandler done) {
  if (!encode_command(impl_->dialect, request.command)) {
    auto e =
        impl_->error(op,
                     std::string(command_name(request.command)) + " does not exist in the " +
                         std::string(dialect_name(impl_->dialect)) + " dialect this client speaks",
                     false);
    boost::asio::post(impl_->io, [done = std::move(done), e] { done(e, {}); });
    return;
  }
  impl_->submit(Operation{std::move(request), std::move(op), timeout, Clock::now() + timeout,
                          std::move(done)});
}

void AsyncClient::wait(std::vector<std::string> keys, std::string op,
                       std::chrono::milliseconds timeout, ReplyHandler done) {
  request(make_request(Command::Wait, std::move(keys)), std::move(op), timeout, std::move(done));
}

void AsyncClient::close() {
  auto& impl = *impl_;
  auto e = impl.error("close", "the client was closed before the reply came", false);
  std::vector<ReplyHandler> failed;
  if (impl.in_flight) failed.push_back(std::move(impl.in_flight->done));
  for (auto& op : impl.queue) failed.push_back(std::move(op.done));
  impl.queue.clear();
  auto waiting = std::exchange(impl.connect_waiters, {});
  impl.drop_connection();
  for (auto& done : failed) {
    boost::asio::post(impl.io, [done = std::move(done), e] { done(e, {}); });
  }
  for (auto& done : waiting) boost::asio::post(impl.io, [done = std::move(done), e] { done(e); });
}

bool AsyncClient::connected() const { return impl_->state == Impl::State::Ready; }

Dialect AsyncClient::dialect() const { return impl_->dialect; }

const std::string& AsyncClient::endpoint() const { return impl_->endpoint; }

}  // namespace ddp::store
