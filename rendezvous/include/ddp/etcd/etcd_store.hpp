#pragma once
// The c10d store's semantics (store::Store) over etcd, every key under a prefix: the store
// rendezvous engine runs on it unchanged. Each read-modify-write (add, compare_set, append) is
// a transaction that compares the key's mod_revision and is retried when another writer got
// there first; get and wait watch from the revision they read, never poll. Every write
// (set, add, compare_set, append, delete_key) applies exactly once, also when etcd's answer
// is lost (client.hpp); the client's write marker is kept beside the prefix (prefix without
// its last '/' + ".writes/<id>"), so num_keys() never counts it.

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "ddp/etcd/client.hpp"
#include "ddp/store/store.hpp"

namespace ddp::etcd {

class EtcdStore : public store::Store {
 public:
  // timeout: the store's timeout(), how long get() and multi_get() wait for a missing key
  // (store::StoreTimeout after it).
  EtcdStore(ClientOptions options, std::string prefix, std::chrono::milliseconds timeout);

  void set(const std::string& key, std::string_view value) override;
  std::string get(const std::string& key) override;
  std::int64_t add(const std::string& key, std::int64_t delta) override;
  std::string compare_set(const std::string& key, std::string_view expected,
                          std::string_view desired) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  using store::Store::wait;  // wait(keys): with timeout()
  bool delete_key(const std::string& key) override;
  std::int64_t num_keys() override;  // keys under the prefix
  void append(const std::string& key, std::string_view value) override;
  std::vector<std::string> multi_get(const std::vector<std::string>& keys) override;
  void multi_set(const std::vector<std::string>& keys,
                 const std::vector<std::string>& values) override;

  // A wait() also ends, with store::StoreTimeout ("look again"), as soon as a key starting
  // with prefix + sub_prefix is deleted (a node's lease expired): waiters see a lost node at
  // once through their watch.
  void wake_on_delete(std::string sub_prefix);

  // set() with the key bound to a lease: it vanishes when the lease expires.
  void set_with_lease(const std::string& key, std::string_view value, std::int64_t lease);
  // The keys under prefix + sub_prefix that exist now, without the prefix (one range).
  std::vector<std::string> keys_under(const std::string& sub_prefix);

  Client& client() { return client_; }

 private:
  // Reads keys until every one exists (watching from the revision read in between), then
  // their values. wake: the wake_on_delete() prefix also ends the wait. StoreTimeout after
  // timeout.
  std::vector<std::string> read_when_present(const std::vector<std::string>& keys,
                                             std::chrono::milliseconds timeout, bool wake);
  // Watches from revision `from` until each of missing has been put.
  void watch_until_set(const std::vector<std::string>& missing, std::int64_t from,
                       std::chrono::steady_clock::time_point deadline,
                       std::chrono::milliseconds timeout, bool wake);

  Client client_;
  std::string prefix_;
  std::string wake_prefix_;  // empty: none
};

}  // namespace ddp::etcd
