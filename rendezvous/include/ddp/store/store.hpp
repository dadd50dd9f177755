#pragma once
// The key-value store every job meets through: the interface that the TCP client, the
// in-memory store and the prefix view implement, with PyTorch's c10d Store semantics.
//
// Values are arbitrary bytes held in std::string. Every call that can block takes or uses a
// timeout and throws StoreError naming the key(s) it waited for when it expires.

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace ddp::store {

// How long a wait or get blocks by default (PyTorch's default store timeout).
inline constexpr std::chrono::milliseconds kDefaultTimeout = std::chrono::minutes(5);

// Any failure of a store operation: a timeout, a refused or lost connection, a protocol
// violation. what() names the endpoint, the operation and the key where one applies.
class StoreError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A wait that ran out of time. what() lists the keys still missing.
class StoreTimeout : public StoreError {
 public:
  using StoreError::StoreError;
};

class Store {
 public:
  virtual ~Store() = default;

  // Stores value under key, replacing any earlier value, and wakes waiters on key.
  virtual void set(const std::string& key, std::string_view value) = 0;

  // Waits (up to timeout()) until key exists, then returns its value.
  virtual std::string get(const std::string& key) = 0;

  // Adds delta to the integer stored under key as decimal text (missing = 0) and returns the
  // new value.
  virtual std::int64_t add(const std::string& key, std::int64_t delta) = 0;

  // PyTorch's compare-and-set: missing key and empty expected stores desired; missing key and
  // non-empty expected stores nothing and returns expected; equal stores desired; otherwise
  // returns the current value. Returns the value after the operation.
  virtual std::string compare_set(const std::string& key, std::string_view expected,
                                  std::string_view desired) = 0;

  // True when every key exists. Does not block.
  virtual bool check(const std::vector<std::string>& keys) = 0;

  // Blocks until every key exists; throws StoreTimeout after timeout.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout()); }

  // Removes key; returns whether it existed.
  virtual bool delete_key(const std::string& key) = 0;

  // Number of keys in the whole store (not only under a prefix, as in PyTorch).
  virtual std::int64_t num_keys() = 0;

  // Appends bytes to the value under key (creating it).
  virtual void append(const std::string& key, std::string_view value) = 0;

  // Waits for all keys, then returns their values in order.
  virtual std::vector<std::string> multi_get(const std::vector<std::string>& keys) = 0;

  virtual void multi_set(const std::vector<std::string>& keys,
                         const std::vector<std::string>& values) = 0;

  // From any thread: makes the call now blocked on this store, and every later call, fail
  // at once with StoreError, so that an owner shutting down never waits on a store that does
  // not answer. Does nothing by default (a store whose calls cannot block for long).
  virtual void interrupt() {}

  // The default timeout for get/wait/multi_get.
  std::chrono::milliseconds timeout() const { return timeout_; }
  void set_timeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }

 private:
  std::chrono::milliseconds timeout_ = kDefaultTimeout;
};

}  // namespace ddp::store
