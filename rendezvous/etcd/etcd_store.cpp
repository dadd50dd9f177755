#include "ddp/etcd/etcd_store.hpp"

#include <algorithm>
#include <functional>
#include <limits>
#include <optional>
#include <set>

#include "ddp/store/store_util.hpp"

namespace ddp::etcd {
namespace {

using Clock = std::chrono::steady_clock;
using store::StoreError;
using store::StoreTimeout;

// How often a read-modify-write is tried again after another writer changed the key first.
constexpr int kMaxUpdateAttempts = 1000;

std::chrono::milliseconds left(Clock::time_point deadline) {
  auto d = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
  return d.count() < 0 ? std::chrono::milliseconds(0) : d;
}

// The outcome of update(): whether change's value was stored, and the value found before.
struct Update {
  bool stored = false;
  std::optional<std::string> before;  // nullopt: the key was missing
};

// Applies change to the key's current value (nullopt: missing) in a transaction that holds
// only while the key is unchanged, and again on the newer value when it was not. change
// returns the value to store, or nullopt to store nothing.
Update update(
    Client& client, const std::string& key,
    const std::function<std::optional<std::string>(const std::optional<std::string>&)>& change) {
  RangeResult read = client.range(key);
  std::optional<KeyValue> current;
  if (!read.kvs.empty()) current = read.kvs.front();
  for (int attempt = 0; attempt < kMaxUpdateAttempts; ++attempt) {
    std::optional<std::string> before;
    if (current) before = current->value;
    std::optional<std::string> next = change(before);
    if (!next) return {false, before};
    TxnResult txn = client.put_if(key, *next, current ? current->mod_revision : 0);
    if (txn.succeeded) return {true, before};
    current = txn.current;
  }
  throw StoreError("etcd store: key '" + key + "' kept changing under " +
                   std::to_string(kMaxUpdateAttempts) + " attempts to update it");
}

}  // namespace

namespace {

// The client's write marker beside the keys, outside the prefix (num_keys never counts it):
// "/ddprun/job.writes/<id>" for the prefix "/ddprun/job/".
ClientOptions with_marker_beside(ClientOptions options, const std::string& prefix) {
  std::string base = prefix;
  if (!base.empty() && base.back() == '/') base.pop_back();
  options.write_marker_prefix = base + ".writes/";
  return options;
}

}  // namespace

EtcdStore::EtcdStore(ClientOptions options, std::string prefix, std::chrono::milliseconds timeout)
    : client_(with_marker_beside(std::move(options), prefix)), prefix_(std::move(prefix)) {
  set_timeout(timeout);
}

void EtcdStore::set(const std::string& key, std::string_view value) {
  client_.put(prefix_ + key, std::string(value));
}

std::string EtcdStore::get(const std::string& key) {
  return read_when_present({key}, timeout(), false)[0];
}

std::int64_t EtcdStore::add(const std::string& key, std::int64_t delta) {
  std::int64_t sum = 0;
  update(client_, prefix_ + key, [&](const std::optional<std::string>& current) {
    std::int64_t base = 0;
    if (current) {
      auto parsed = store::parse_counter(*current);
      if (!parsed) throw StoreError("add: key '" + key + "' does not hold an integer");
      base = *parsed;
    }
    // Wraps on overflow like two's complement, as the TCP store's server does.
    sum = static_cast<std::int64_t>(static_cast<std::uint64_t>(base) +
                                    static_cast<std::uint64_t>(delta));
    return std::optional<std::string>(std::to_string(sum));
  });
  return sum;
}

std::string EtcdStore::compare_set(const std::string& key, std::string_view expected,
                                   std::string_view desired) {
  Update result =
      update(client_, prefix_ + key,
             [&](const std::optional<std::string>& current) -> std::optional<std::string> {
               if (!current) {
                 if (expected.empty()) return std::string(desired);
                 return std::nullopt;
               }
               if (*current == expected) return std::string(desired);
               return std::nullopt;
             });
  if (result.stored) return std::string(desired);
  return result.before ? *result.before : std::string(expected);
}

bool EtcdStore::check(const std::vector<std::string>& keys) {
  for (const auto& key : keys) {
    if (client_.range(prefix_ + key, false, true).count == 0) return false;
  }
  return true;
}

void EtcdStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  read_when_present(keys, timeout, true);
}

bool EtcdStore::delete_key(const std::string& key) { return client_.remove(prefix_ + key) > 0; }

std::int64_t EtcdStore::num_keys() { return client_.range(prefix_, true, true).count; }

void EtcdStore::append(const std::string& key, std::string_view value) {
  update(client_, prefix_ + key, [&](const std::optional<std::string>& current) {
    return std::optional<std::string>(current ? *current + std::string(value) : std::string(value));
  });
}

std::vector<std::string> EtcdStore::multi_get(const std::vector<std::string>& keys) {
  return read_when_present(keys, timeout(), false);
}

void EtcdStore::multi_set(const std::vector<std::string>& keys,
                          const std::vector<std::string>& values) {
  if (keys.size() != values.size()) throw StoreError("multi_set: keys and values differ in count");
  for (std::size_t i = 0; i < keys.size(); ++i) set(keys[i], values[i]);
}

void EtcdStore::wake_on_delete(std::string sub_prefix) { wake_prefix_ = std::move(sub_prefix); }

void EtcdStore::set_with_lease(const std::string& key, std::string_view value, std::int64_t lease) {
  client_.put(prefix_ + key, std::string(value), lease);
}

std::vector<std::string> EtcdStore::keys_under(const std::string& sub_prefix) {
  std::vector<std::string> keys;
  for (const KeyValue& kv : client_.range(prefix_ + sub_prefix, true, true).kvs) {
    keys.push_back(kv.key.substr(prefix_.size()));
  }
  return keys;
}

std::vector<std::string> EtcdStore::read_when_present(const std::vector<std::string>& keys,
                                                      std::chrono::milliseconds timeout,
                                                      bool wake) {
  auto deadline = Clock::now() + timeout;
  while (true) {
    std::vector<std::string> values;
    std::vector<std::string> missing;
    std::int64_t revision = std::numeric_limits<std::int64_t>::max();
    for (const auto& key : keys) {
      RangeResult read = client_.range(prefix_ + key);
      revision = std::min(revision, read.revision);
      if (read.kvs.empty()) {
        missing.push_back(key);
      } else {
        values.push_back(read.kvs.front().value);
      }
    }
    if (missing.empty()) return values;
    watch_until_set(missing, revision + 1, deadline, timeout, wake);
  }
}

void EtcdStore::watch_until_set(const std::vector<std::string>& missing, std::int64_t from,
                                std::chrono::steady_clock::time_point deadline,
                                std::chrono::milliseconds timeout, bool wake) {
  std::set<std::string> waited;
  for (const auto& key : missing) waited.insert(prefix_ + key);
  std::set<std::string> absent = waited;
  std::string wake_prefix = prefix_ + wake_prefix_;
  bool wake_watch = wake && !wake_prefix_.empty();
  // One key: watch just it; else (or to see deletes) every key under the prefix.
  bool whole_prefix = wake_watch || waited.size() > 1;
  const std::string& watched = whole_prefix ? prefix_ : *waited.begin();
  while (!absent.empty()) {
    auto remaining = left(deadline);
    if (remaining.count() == 0) {
      throw StoreTimeout("etcd store " + client_.endpoints_text() + " (prefix '" + prefix_ +
                         "'): timed out after " + std::to_string(timeout.count()) +
                         " ms waiting for " + store::describe_keys(missing));
    }
    for (const WatchEvent& event : client_.watch(watched, whole_prefix, from, remaining)) {
      from = std::max(from, event.kv.mod_revision + 1);
      const std::string& key = event.kv.key;
      if (event.type == WatchEvent::Type::kPut) {
        absent.erase(key);
        continue;
      }
      if (waited.contains(key)) absent.insert(key);
      if (wake_watch && key.starts_with(wake_prefix)) {
        throw StoreTimeout("etcd store: woken while waiting for " + store::describe_keys(missing) +
                           ": key '" + key.substr(prefix_.size()) +
                           "' was deleted (its lease expired?)");
      }
    }
  }
}

}  // namespace ddp::etcd
