#include "ddp/store/client.hpp"

#include <algorithm>
#include <boost/asio/post.hpp>
#include <stdexcept>

#include "ddp/store/store_util.hpp"

namespace ddp::store {
namespace {

using Clock = std::chrono::steady_clock;

std::string endpoint_of(const std::string& host, std::uint16_t port) {
  bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

std::string op_with_key(std::string_view op, const std::string& key) {
  return std::string(op) + " '" + key + "'";
}

// Runs io until done is set by a handler. Every operation under way has a deadline timer,
// so this ends; an io_context out of work before that is a bug of this file.
void run_until(boost::asio::io_context& io, const bool& done) {
  io.restart();
  while (!done) {
    if (io.run_one() == 0) {
      throw std::logic_error("store client: an operation ended without calling its handler");
    }
  }
}

// Connects (retrying until connect_timeout) as a 1.x client, sends GETNUMKEYS and returns
// V1 when its reply arrives within reply_timeout, else V2 (a 2.x server reads the byte as
// the start of a WAIT and waits for more).
Dialect probe_dialect(const std::string& host, std::uint16_t port,
                      std::chrono::milliseconds connect_timeout,
                      std::chrono::milliseconds reply_timeout) {
  boost::asio::io_context io(1);
  ClientOptions options;
  options.host = host;
  options.port = port;
  options.dialect = Dialect::V1;
  options.connect_timeout = connect_timeout;
  AsyncClient probe(io, options);
  bool done = false;
  std::exception_ptr error;
  probe.connect([&](std::exception_ptr e) {
    error = e;
    done = true;
  });
  run_until(io, done);
  if (error) {
    try {
      std::rethrow_exception(error);
    } catch (const StoreError& e) {
      throw StoreError("store client " + endpoint_of(host, port) + ": detect dialect: " + e.what());
    }
  }
  done = false;
  probe.request(make_request(Command::GetNumKeys), "detect dialect", reply_timeout,
                [&](std::exception_ptr e, Reply) {
                  error = e;
                  done = true;
                });
  run_until(io, done);
  return error ? Dialect::V2 : Dialect::V1;
}

}  // namespace

Client::Client(ClientOptions options)
    : options_(std::move(options)), endpoint_(endpoint_of(options_.host, options_.port)) {
  dialect_ = options_.dialect ? *options_.dialect
                              : probe_dialect(options_.host, options_.port,
                                              options_.connect_timeout, kDefaultProbeTimeout);
  set_timeout(options_.timeout);
  ClientOptions async_options = options_;
  async_options.dialect = dialect_;
  async_ = std::make_unique<AsyncClient>(io_, async_options);
  std::lock_guard lock(mutex_);
  ensure_connected();
}

Client::~Client() {
  // Fails what is pending (nothing, between calls) before the io_context goes away.
  async_.reset();
}

void Client::interrupt() {
  interrupted_ = true;
  // Runs inside the call in progress, if any (its io_context is run only by a caller); a
  // later call sees the flag first, and the handler is dropped with the io_context.
  boost::asio::post(io_, [this] { async_->close(); });
}

Reply Client::call(const std::function<void(AsyncClient::ReplyHandler)>& submit) {
  if (interrupted_) {
    throw StoreError("store client " + endpoint_ + ": interrupted (its owner is shutting down)");
  }
  bool done = false;
  std::exception_ptr error;
  Reply reply;
  submit([&](std::exception_ptr e, Reply r) {
    error = e;
    reply = std::move(r);
    done = true;
  });
  run_until(io_, done);
  if (error) std::rethrow_exception(error);
  return reply;
}

void Client::ensure_connected() {
  if (async_->connected()) return;
  call([&](AsyncClient::ReplyHandler done) {
    async_->connect([done = std::move(done)](std::exception_ptr e) { done(e, {}); });
  });
}

Reply Client::request(Request request, const std::string& op) {
  ensure_connected();  // as before: the timeout starts once connected
  return call([&](AsyncClient::ReplyHandler done) {
    async_->request(std::move(request), op, timeout(), std::move(done));
  });
}

void Client::require_v2(std::string_view op) {
  if (dialect_ == Dialect::V1) {
    throw StoreError("store client " + endpoint_ + ": " + std::string(op) +
                     " needs a 2.x server; this client speaks the 1.x dialect");
  }
}

void Client::set(const std::string& key, std::string_view value) {
  std::lock_guard lock(mutex_);
  request(make_request(Command::Set, {key}, {std::string(value)}), op_with_key("set", key));
}

std::string Client::get(const std::string& key) {
  std::lock_guard lock(mutex_);
  const std::string op = op_with_key("get", key);
  wait_locked({key}, timeout(), op);
  return std::move(request(make_request(Command::Get, {key}), op).values.at(0));
}

std::int64_t Client::add(const std::string& key, std::int64_t delta) {
  std::lock_guard lock(mutex_);
  return request(make_request(Command::Add, {key}, {}, delta), op_with_key("add", key)).number;
}

std::string Client::compare_set(const std::string& key, std::string_view expected,
                                std::string_view desired) {
  std::lock_guard lock(mutex_);
  Reply reply = request(
      make_request(Command::CompareSet, {key}, {std::string(expected), std::string(desired)}),
      op_with_key("compare_set", key));
  return std::move(reply.values.at(0));
}

bool Client::check(const std::vector<std::string>& keys) {
  std::lock_guard lock(mutex_);
  return request(make_request(Command::Check, keys), "check " + describe_keys(keys)).code ==
         kCheckReady;
}

void Client::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::lock_guard lock(mutex_);
  wait_locked(keys, timeout, "wait");
}

void Client::wait_locked(const std::vector<std::string>& keys, std::chrono::milliseconds timeout,
                         const std::string& op) {
  ensure_connected();
  call([&](AsyncClient::ReplyHandler done) { async_->wait(keys, op, timeout, std::move(done)); });
}

bool Client::delete_key(const std::string& key) {
  std::lock_guard lock(mutex_);
  return request(make_request(Command::DeleteKey, {key}), op_with_key("delete_key", key)).number >
         0;
}

std::int64_t Client::num_keys() {
  std::lock_guard lock(mutex_);
  return request(make_request(Command::GetNumKeys), "num_keys").number;
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
  request(make_request(Command::Append, {key}, {std::string(value)}), op_with_key("append", key));
}

std::vector<std::string> Client::multi_get(const std::vector<std::string>& keys) {
  std::lock_guard lock(mutex_);
  const std::string op = "multi_get " + describe_keys(keys);
  wait_locked(keys, timeout(), op);
  if (dialect_ == Dialect::V2) return request(make_request(Command::MultiGet, keys), op).values;
  std::vector<std::string> values;  // 1.x: one GET per key
  values.reserve(keys.size());
  for (const auto& key : keys) {
    values.push_back(std::move(request(make_request(Command::Get, {key}), op).values.at(0)));
  }
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
  if (dialect_ == Dialect::V2) {
    request(make_request(Command::MultiSet, keys, values), op);
    return;
  }
  for (std::size_t i = 0; i < keys.size(); ++i) {  // 1.x: one SET per key
    request(make_request(Command::Set, {keys[i]}, {values[i]}), op);
  }
}

std::chrono::nanoseconds Client::ping() {
  std::lock_guard lock(mutex_);
  ensure_connected();
  const auto start = Clock::now();
  if (dialect_ == Dialect::V1) {  // no PING in 1.x: the smallest round trip it has
    request(make_request(Command::GetNumKeys), "ping");
    return Clock::now() - start;
  }
  const std::uint32_t nonce = ++nonce_;
  if (request(make_request(Command::Ping, {}, {}, 0, nonce), "ping").u32 != nonce) {
    async_->close();
    throw StoreError("store client " + endpoint_ + ": ping: the server answered a wrong nonce");
  }
  return Clock::now() - start;
}

void Client::queue_push(const std::string& key, std::string_view value) {
  std::lock_guard lock(mutex_);
  require_v2("queue_push");
  request(make_request(Command::QueuePush, {key}, {std::string(value)}),
          op_with_key("queue_push", key));
}

std::string Client::queue_pop(const std::string& key, std::chrono::milliseconds timeout) {
  std::lock_guard lock(mutex_);
  require_v2("queue_pop");
  const std::string op = op_with_key("queue_pop", key);
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    wait_locked({key},
                std::chrono::duration_cast<std::chrono::milliseconds>(
                    std::max(deadline - Clock::now(), Clock::duration::zero())),
                op);
    Reply reply = request(make_request(Command::QueuePop, {key}), op);
    if (reply.number > 0) return std::move(reply.values.at(0));
    // Another client popped it between our wait and our pop: wait again.
  }
}

std::int64_t Client::queue_len(const std::string& key) {
  std::lock_guard lock(mutex_);
  require_v2("queue_len");
  return request(make_request(Command::QueueLen, {key}), op_with_key("queue_len", key)).number;
}

Dialect detect_dialect(const std::string& host, std::uint16_t port,
                       std::chrono::milliseconds timeout) {
  return probe_dialect(host, port, timeout, timeout);
}

}  // namespace ddp::store
