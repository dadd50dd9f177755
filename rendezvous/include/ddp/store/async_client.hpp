#pragma once
// An asynchronous client of a c10d TCPStore server (ours, or PyTorch's in its own dialect)
// on the caller's Boost.Asio io_context: what an event loop uses to talk to a store without
// ever blocking. The blocking Client is a thin wrapper over it.
//
// Requests are sent one at a time, in the order they were made: each is written once the
// one before it is answered (a 2.x WAIT's answer may come at any time, so nothing can be
// pipelined behind it). Each request has a deadline: its timeout, counted from the call to
// the last byte of its reply. Completion handlers run on the io_context's thread, one per
// request, exactly once.
//
// Failures are StoreError (StoreTimeout for a deadline) passed to the handler as an
// exception_ptr, naming the endpoint, the operation and the key(s). A failed request drops
// the connection (except a 2.x WAIT past its deadline, which is canceled on the server with
// CANCEL_WAIT and leaves the connection usable); the next request connects again.
//
// Threading: use it only from the io_context's thread (construct it anywhere before the
// loop runs). Lifetime: the io_context must outlive it. Destroying it (or close()) fails
// every request not yet answered; their handlers are posted to the io_context.

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ddp/store/client_options.hpp"
#include "ddp/store/wire_codec.hpp"

namespace ddp::store {

class AsyncClient {
 public:
  // error: null on success.
  using ConnectHandler = std::function<void(std::exception_ptr error)>;
  using ReplyHandler = std::function<void(std::exception_ptr error, Reply reply)>;

  // options.dialect must be set (V1 or V2): probe first with detect_dialect() if unknown.
  // Throws std::invalid_argument when it is not. Connects on the first request or connect().
  AsyncClient(boost::asio::io_context& io, ClientOptions options);
  ~AsyncClient();
  AsyncClient(const AsyncClient&) = delete;
  AsyncClient& operator=(const AsyncClient&) = delete;

  // Connects now, retrying refused or unreachable attempts with back-off (10 ms doubling
  // to 1 s) until options.connect_timeout; 2.x: then VALIDATE + PING. done(null) at once
  // when already connected.
  void connect(ConnectHandler done);

  // Sends request in this client's dialect (connecting first if needed) and hands its
  // decoded reply to done; a request without a reply (SET, APPEND, MULTI_SET, QUEUE_PUSH)
  // completes once written. op names the operation in errors ("get 'k'").
  void request(Request request, std::string op, std::chrono::milliseconds timeout,
               ReplyHandler done);

  // WAIT for keys: done(null) once they all exist, or StoreTimeout naming them after
  // timeout (2.x: the wait is canceled on the server and the connection stays usable).
  void wait(std::vector<std::string> keys, std::string op, std::chrono::milliseconds timeout,
            ReplyHandler done);

  // Drops the connection and fails every request not yet answered. The next request
  // connects again.
  void close();

  bool connected() const;
  Dialect dialect() const;
  // "host:port"
  const std::string& endpoint() const;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace ddp::store
