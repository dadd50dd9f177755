#pragma once
// A blocking client of a c10d TCPStore server: ours (either dialect), PyTorch 2.x's (2.x
// dialect) or PyTorch 1.x's (1.x dialect).
//
// Threading: every call takes an internal mutex, so a Client may be shared between threads,
// but calls on one Client run one at a time (a blocked wait holds the others back). Give each
// thread its own Client for concurrency.
//
// A thin blocking wrapper over AsyncClient: each call runs a private io_context until its
// operation completed.
//
// Timeouts: connecting retries with back-off until connect_timeout; every later call waits
// at most timeout() (or the wait's own timeout) for the whole of each reply, however
// slowly its bytes arrive. Every failure throws
// StoreError (StoreTimeout for an expired wait) naming the endpoint, the operation and the
// key. After a failure the connection is dropped and the next call reconnects.

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>

#include "ddp/store/async_client.hpp"
#include "ddp/store/client_options.hpp"
#include "ddp/store/store.hpp"
#include "ddp/store/wire_codec.hpp"

namespace ddp::store {

class Client : public Store {
 public:
  // Connects (2.x: VALIDATE + PING) before returning; throws StoreError when no server
  // answered within connect_timeout.
  explicit Client(ClientOptions options);
  ~Client() override;
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  void set(const std::string& key, std::string_view value) override;
  std::string get(const std::string& key) override;
  std::int64_t add(const std::string& key, std::int64_t delta) override;
  std::string compare_set(const std::string& key, std::string_view expected,
                          std::string_view desired) override;
  bool check(const std::vector<std::string>& keys) override;
  using Store::wait;
  // 2.x: cancels the wait on the server on timeout (CANCEL_WAIT); 1.x: drops the connection.
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  bool delete_key(const std::string& key) override;
  std::int64_t num_keys() override;
  // 1.x has no APPEND: emulated with COMPARE_SET retries.
  void append(const std::string& key, std::string_view value) override;
  // 1.x: WAIT, then one GET per key.
  std::vector<std::string> multi_get(const std::vector<std::string>& keys) override;
  // 1.x: one SET per key.
  void multi_set(const std::vector<std::string>& keys,
                 const std::vector<std::string>& values) override;

  // Thread-safe: closes the connection under the call in progress (it fails with
  // StoreError) and fails every later call at once.
  void interrupt() override;

  // A round trip to the server (2.x PING; 1.x GETNUMKEYS). Returns its duration.
  std::chrono::nanoseconds ping();

  // Queues (2.x servers only; StoreError on 1.x).
  void queue_push(const std::string& key, std::string_view value);
  // Waits up to timeout for an element, then pops it.
  std::string queue_pop(const std::string& key, std::chrono::milliseconds timeout);
  std::int64_t queue_len(const std::string& key);

  Dialect dialect() const { return dialect_; }
  // "host:port"
  const std::string& endpoint() const { return endpoint_; }

 private:
  // Runs the private io_context until submit's operation completed; rethrows its error.
  Reply call(const std::function<void(AsyncClient::ReplyHandler)>& submit);
  Reply request(Request request, const std::string& op);
  void ensure_connected();
  void wait_locked(const std::vector<std::string>& keys, std::chrono::milliseconds timeout,
                   const std::string& op);
  void require_v2(std::string_view op);

  ClientOptions options_;
  std::string endpoint_;
  Dialect dialect_ = Dialect::V2;
  std::mutex mutex_;
  boost::asio::io_context io_{1};  // run only by the caller of a method, under mutex_
  std::unique_ptr<AsyncClient> async_;
  std::uint32_t nonce_ = 0;
  std::atomic<bool> interrupted_{false};
};

// Finds which dialect the server at host:port speaks without risking a 1.x server: sends
// the 1.x GETNUMKEYS byte (06) and returns V1 if its 8-byte reply arrives within timeout,
// else V2 (a 2.x server reads 06 as WAIT and waits for more). Our server answers 1.x here.
// Throws StoreError when nothing listens there.
Dialect detect_dialect(const std::string& host, std::uint16_t port,
                       std::chrono::milliseconds timeout = kDefaultProbeTimeout);

}  // namespace ddp::store
