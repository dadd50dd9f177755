#pragma once
// An in-process store for tests and for ranks run as threads: the same semantics as the TCP
// store, without sockets, because it keeps its keys in the server's own StoreTable (one
// implementation of c10d's SET, ADD, COMPARE_SET, APPEND and DELETE). Thread-safe.

#include <condition_variable>
#include <memory>
#include <mutex>

#include "ddp/store/store.hpp"

namespace ddp::store {

class StoreTable;

class MemoryStore : public Store {
 public:
  MemoryStore();
  ~MemoryStore() override;

  void set(const std::string& key, std::string_view value) override;
  std::string get(const std::string& key) override;
  std::int64_t add(const std::string& key, std::int64_t delta) override;
  std::string compare_set(const std::string& key, std::string_view expected,
                          std::string_view desired) override;
  bool check(const std::vector<std::string>& keys) override;
  using Store::wait;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  bool delete_key(const std::string& key) override;
  std::int64_t num_keys() override;
  void append(const std::string& key, std::string_view value) override;
  std::vector<std::string> multi_get(const std::vector<std::string>& keys) override;
  void multi_set(const std::vector<std::string>& keys,
                 const std::vector<std::string>& values) override;

 private:
  // Waits on changed_ until every key exists. The lock must be held.
  void wait_locked(std::unique_lock<std::mutex>& lock, const std::vector<std::string>& keys,
                   std::chrono::milliseconds timeout);
  bool has_all_locked(const std::vector<std::string>& keys) const;

  std::mutex mutex_;
  std::condition_variable changed_;
  std::unique_ptr<StoreTable> table_;  // guarded by mutex_
};

}  // namespace ddp::store
