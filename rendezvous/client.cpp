#include "ddp/store/client.hpp"

#include <algorithm>

#include "ddp/store/store_util.hpp"
#include "tcp_connection.hpp"

namespace ddp::store {
namespace {

using Clock = std::chrono::steady_clock;

std::string endpoint_of(const std::string& host, std::uint16_t port) {
  bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

std::string ms_text(std::chrono::milliseconds ms) { return std::to_string(ms.count()) + " ms"; }

std::string op_with_key(std::string_view op, const std::string& key) {
  return std::string(op) + " '" + key + "'";
}

// How long a canceled wait waits for the server's WAIT_CANCELED.
constexpr std::chrono::milliseconds kCancelReplyTimeout{5000};
// The 2.x handshake gets what is left of connect_timeout, but at least this long.
constexpr std::chrono::milliseconds kMinHandshakeTimeout{1000};

// Connects (retrying until connect_timeout), sends the 1.x GETNUMKEYS byte and returns V1
// when its 8-byte reply arrives within reply_timeout, else V2.
Dialect probe_dialect(const std::string& host, std::uint16_t port,
                      std::chrono::milliseconds connect_timeout,
                      std::chrono::milliseconds reply_timeout) {
  std::string error;
  auto conn = TcpConnection::connect(host, port, Clock::now() + connect_timeout, error);
  const std::string where = endpoint_of(host, port);
  if (!conn) {
    throw StoreError("store client " + where + ": detect dialect: no store server answered within " +
                     ms_text(connect_timeout) + " (last error: " + error + ")");
  }
  std::string probe;
  put_u8(probe, *encode_command(Dialect::V1, Command::GetNumKeys));
  if (conn->send_all(probe, reply_timeout) != TcpConnection::Io::Ok) {
    throw StoreError("store client " + where + ": detect dialect: cannot send the probe");
  }
  char reply[8];
  return conn->read(reply, 8, Clock::now() + reply_timeout) == TcpConnection::Io::Ok ? Dialect::V1
                                                                                     : Dialect::V2;
}

}  // namespace

Client::Client(ClientOptions options)
    : options_(std::move(options)), endpoint_(endpoint_of(options_.host, options_.port)) {
  dialect_ = options_.dialect ? *options_.dialect
                              : probe_dialect(options_.host, options_.port,
                                              options_.connect_timeout, kDefaultProbeTimeout);
  set_timeout(options_.timeout);
  std::lock_guard lock(mutex_);
  connect_locked();
}

Client::~Client() = default;

void Client::connect_locked() {
  std::string error;
  auto deadline = Clock::now() + options_.connect_timeout;
  conn_ = TcpConnection::connect(options_.host, options_.port, deadline, error);
  if (!conn_) {
    throw StoreError("store client " + endpoint_ + ": connect: no store server answered within " +
                     ms_text(options_.connect_timeout) + " (last error: " + error + ")");
  }
  if (dialect_ == Dialect::V2) {
    out_.clear();
    put_u8(out_, *encode_command(Dialect::V2, Command::Validate));
    put_u32(out_, kValidationMagic);
    put_u8(out_, *encode_command(Dialect::V2, Command::Ping));
    put_u32(out_, ++nonce_);
    send("connect (VALIDATE + PING)");
    // Part of connecting: bounded by connect_timeout, not by the (longer) reply timeout.
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    char reply[4];
    expect_reply_within(std::min(timeout(), std::max(left, kMinHandshakeTimeout)));
    read(reply, 4, "connect (PING)");
    if (get_u32(reply) != nonce_) fail("connect (PING)", "the server answered a wrong nonce");
  }
}

void Client::ensure_connected() {
  if (!conn_) connect_locked();
}

void Client::drop() { conn_.reset(); }

void Client::fail(std::string_view op, std::string_view detail, bool timeout) {
  drop();
  std::string message = "store client " + endpoint_ + ": " + std::string(op) + ": " +
                        std::string(detail);
  if (timeout) throw StoreTimeout(message);
  throw StoreError(message);
}

void Client::begin(Command command) {
  ensure_connected();
  out_.clear();
  auto byte = encode_command(dialect_, command);
  if (!byte) {
    throw StoreError("store client " + endpoint_ + ": " + std::string(command_name(command)) +
                     " does not exist in the " + std::string(dialect_name(dialect_)) +
                     " dialect this client speaks");
  }
  put_u8(out_, *byte);
}

void Client::send(std::string_view op) {
  switch (conn_->send_all(out_, timeout())) {
    case TcpConnection::Io::Ok: expect_reply_within(timeout()); return;
    case TcpConnection::Io::Timeout: fail(op, "timed out after " + ms_text(timeout()) + " sending the request", true);
    case TcpConnection::Io::Closed: fail(op, "the server closed the connection");
    case TcpConnection::Io::Error: fail(op, "send failed: " + conn_->last_error());
  }
}

void Client::expect_reply_within(std::chrono::milliseconds timeout) {
  reply_timeout_ = timeout;
  reply_deadline_ = Clock::now() + timeout;
}

void Client::read(char* dst, std::size_t n, std::string_view op) {
  switch (conn_->read(dst, n, reply_deadline_)) {
    case TcpConnection::Io::Ok: return;
    case TcpConnection::Io::Timeout:
      fail(op, "timed out after " + ms_text(reply_timeout_) + " waiting for the reply", true);
    case TcpConnection::Io::Closed:
      fail(op, "the server closed the connection (it logs why when it rejected a request)");
    case TcpConnection::Io::Error: fail(op, "receive failed: " + conn_->last_error());
  }
}

std::uint8_t Client::read_u8(std::string_view op) {
  char b;
  read(&b, 1, op);
  return static_cast<std::uint8_t>(b);
}

std::int64_t Client::read_i64(std::string_view op) {
  char b[8];
  read(b, 8, op);
  return get_i64(b);
}

std::string Client::read_bytes(std::string_view op) {
  char b[8];
  read(b, 8, op);
  std::uint64_t len = get_u64(b);
  if (len > options_.limits.max_value_bytes) {
    fail(op, "the server sent a value of " + std::to_string(len) + " bytes, over the limit of " +
                 std::to_string(options_.limits.max_value_bytes));
  }
  std::string value(static_cast<std::size_t>(len), '\0');
  read(value.data(), value.size(), op);
  return value;
}

void Client::require_v2(std::string_view op) {
  if (dialect_ == Dialect::V1) {
    throw StoreError("store client " + endpoint_ + ": " + std::string(op) +
                     " needs a 2.x server; this client speaks the 1.x dialect");
  }
}

void Client::set(const std::string& key, std::string_view value) {
  std::lock_guard lock(mutex_);
  begin(Command::Set);
  put_bytes(out_, key);
  put_bytes(out_, value);
  send(op_with_key("set", key));
}

std::string Client::get(const std::string& key) {
  std::lock_guard lock(mutex_);
  const std::string op = op_with_key("get", key);
  wait_locked({key}, timeout(), op);
  begin(Command::Get);
  put_bytes(out_, key);
  send(op);
  return read_bytes(op);
}

std::int64_t Client::add(const std::string& key, std::int64_t delta) {
  std::lock_guard lock(mutex_);
  const std::string op = op_with_key("add", key);
  begin(Command::Add);
  put_bytes(out_, key);
  put_i64(out_, delta);
  send(op);
  return read_i64(op);
}

std::string Client::compare_set(const std::string& key, std::string_view expected,
                                std::string_view desired) {
  std::lock_guard lock(mutex_);
  const std::string op = op_with_key("compare_set", key);
  begin(Command::CompareSet);
  put_bytes(out_, key);
  put_bytes(out_, expected);
  put_bytes(out_, desired);
  send(op);
  return read_bytes(op);
}

bool Client::check(const std::vector<std::string>& keys) {
  std::lock_guard lock(mutex_);
  const std::string op = "check " + describe_keys(keys);
  begin(Command::Check);
  put_u64(out_, keys.size());
  for (const auto& key : keys) put_bytes(out_, key);
  send(op);
  return read_u8(op) == kCheckReady;
}

void Client::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::lock_guard lock(mutex_);
  wait_locked(keys, timeout, "wait");
}

void Client::wait_locked(const std::vector<std::string>& keys, std::chrono::milliseconds timeout,
                         std::string_view op) {
  begin(Command::Wait);
  put_u64(out_, keys.size());
  for (const auto& key : keys) put_bytes(out_, key);
  send(op);
  char reply = 0;
  switch (conn_->read(&reply, 1, Clock::now() + timeout)) {
    case TcpConnection::Io::Ok:
      if (static_cast<std::uint8_t>(reply) != kStopWaiting) {
        fail(op, "unexpected wait reply " + std::to_string(static_cast<int>(reply)));
      }
      return;
    case TcpConnection::Io::Timeout: break;
    case TcpConnection::Io::Closed: fail(op, "the server closed the connection");
    case TcpConnection::Io::Error: fail(op, "receive failed: " + conn_->last_error());
  }
  const std::string detail = "timed out after " + ms_text(timeout) + " waiting for " +
                             describe_keys(keys);
  if (dialect_ == Dialect::V1) fail(op, detail, true);  // 1.x cannot cancel: reconnect later
  // 2.x: cancel, then read until WAIT_CANCELED (a racing STOP_WAITING may come first).
  out_.clear();
  put_u8(out_, *encode_command(Dialect::V2, Command::CancelWait));
  send(op);
  expect_reply_within(kCancelReplyTimeout);
  do {
    read(&reply, 1, "cancel wait");
  } while (static_cast<std::uint8_t>(reply) == kStopWaiting);
  throw StoreTimeout("store client " + endpoint_ + ": " + std::string(op) + ": " + detail);
}

bool Client::delete_key(const std::string& key) {
  std::lock_guard lock(mutex_);
  const std::string op = op_with_key("delete_key", key);
  begin(Command::DeleteKey);
  put_bytes(out_, key);
  send(op);
  return read_i64(op) > 0;
}

std::int64_t Client::num_keys() {
  std::lock_guard lock(mutex_);
  begin(Command::GetNumKeys);
  send("num_keys");
  return read_i64("num_keys");
}

void Client::append(const std::string& key, std::string_view value) {
  if (dialect_ == Dialect::V1) {
    // No APPEND in 1.x: compare-and-set until no one else changed the value in between.
    std::string current = check({key}) ? get(key) : std::string();
    for (;;) {
      std::string desired = current + std::string(value);
      std::string result = compare_set(key, current, desired);
      if (result == desired) return;
      current = result;
    }
  }
  std::lock_guard lock(mutex_);
  begin(Command::Append);
  put_bytes(out_, key);
  put_bytes(out_, value);
  send(op_with_key("append", key));
}

std::vector<std::string> Client::multi_get(const std::vector<std::string>& keys) {
  std::lock_guard lock(mutex_);
  const std::string op = "multi_get " + describe_keys(keys);
  wait_locked(keys, timeout(), op);
  std::vector<std::string> values;
  values.reserve(keys.size());
  if (dialect_ == Dialect::V1) {
    for (const auto& key : keys) {
      begin(Command::Get);
      put_bytes(out_, key);
      send(op);
      values.push_back(read_bytes(op));
    }
    return values;
  }
  begin(Command::MultiGet);
  put_u64(out_, keys.size());
  for (const auto& key : keys) put_bytes(out_, key);
  send(op);
  for (std::size_t i = 0; i < keys.size(); ++i) values.push_back(read_bytes(op));
  return values;
}

void Client::multi_set(const std::vector<std::string>& keys,
                       const std::vector<std::string>& values) {
  if (keys.size() != values.size()) {
    throw StoreError("store client " + endpoint_ + ": multi_set: " + std::to_string(keys.size()) +
                     " keys but " + std::to_string(values.size()) + " values");
  }
  std::lock_guard lock(mutex_);
  const std::string op = "multi_set " + describe_keys(keys);
  if (dialect_ == Dialect::V1) {
    for (std::size_t i = 0; i < keys.size(); ++i) {
      begin(Command::Set);
      put_bytes(out_, keys[i]);
      put_bytes(out_, values[i]);
      send(op);
    }
    return;
  }
  begin(Command::MultiSet);
  put_u64(out_, keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    put_bytes(out_, keys[i]);
    put_bytes(out_, values[i]);
  }
  send(op);
}

std::chrono::nanoseconds Client::ping() {
  std::lock_guard lock(mutex_);
  auto start = Clock::now();
  if (dialect_ == Dialect::V1) {
    begin(Command::GetNumKeys);
    send("ping");
    read_i64("ping");
    return Clock::now() - start;
  }
  begin(Command::Ping);
  put_u32(out_, ++nonce_);
  send("ping");
  char reply[4];
  read(reply, 4, "ping");
  if (get_u32(reply) != nonce_) fail("ping", "the server answered a wrong nonce");
  return Clock::now() - start;
}

void Client::queue_push(const std::string& key, std::string_view value) {
  std::lock_guard lock(mutex_);
  require_v2("queue_push");
  begin(Command::QueuePush);
  put_bytes(out_, key);
  put_bytes(out_, value);
  send(op_with_key("queue_push", key));
}

std::string Client::queue_pop(const std::string& key, std::chrono::milliseconds timeout) {
  std::lock_guard lock(mutex_);
  require_v2("queue_pop");
  const std::string op = op_with_key("queue_pop", key);
  auto deadline = Clock::now() + timeout;
  for (;;) {
    wait_locked({key}, std::chrono::duration_cast<std::chrono::milliseconds>(
                           std::max(deadline - Clock::now(), Clock::duration::zero())),
                op);
    begin(Command::QueuePop);
    put_bytes(out_, key);
    send(op);
    if (read_i64(op) > 0) return read_bytes(op);
    // Another client popped it between our wait and our pop: wait again.
  }
}

std::int64_t Client::queue_len(const std::string& key) {
  std::lock_guard lock(mutex_);
  require_v2("queue_len");
  const std::string op = op_with_key("queue_len", key);
  begin(Command::QueueLen);
  put_bytes(out_, key);
  send(op);
  return read_i64(op);
}

Dialect detect_dialect(const std::string& host, std::uint16_t port,
                       std::chrono::milliseconds timeout) {
  return probe_dialect(host, port, timeout, timeout);
}

}  // namespace ddp::store
