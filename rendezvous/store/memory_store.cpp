#include "ddp/store/memory_store.hpp"

#include "ddp/store/store_util.hpp"
#include "store_table.hpp"

namespace ddp::store {

MemoryStore::MemoryStore() : table_(std::make_unique<StoreTable>()) {}
MemoryStore::~MemoryStore() = default;

void MemoryStore::set(const std::string& key, std::string_view value) {
  {
    std::lock_guard lock(mutex_);
    table_->set(key, std::string(value));
  }
  changed_.notify_all();
}

std::string MemoryStore::get(const std::string& key) {
  std::unique_lock lock(mutex_);
  wait_locked(lock, {key}, timeout());
  return *table_->find(key);
}

std::int64_t MemoryStore::add(const std::string& key, std::int64_t delta) {
  std::optional<std::int64_t> value;
  {
    std::lock_guard lock(mutex_);
    value = table_->add(key, delta);
  }
  if (!value) throw StoreError("add: key '" + key + "' does not hold an integer");
  changed_.notify_all();
  return *value;
}

std::string MemoryStore::compare_set(const std::string& key, std::string_view expected,
                                     std::string_view desired) {
  std::string result;
  {
    std::lock_guard lock(mutex_);
    result = table_->compare_set(key, std::string(expected), std::string(desired));
  }
  changed_.notify_all();
  return result;
}

bool MemoryStore::check(const std::vector<std::string>& keys) {
  std::lock_guard lock(mutex_);
  return has_all_locked(keys);
}

void MemoryStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  wait_locked(lock, keys, timeout);
}

bool MemoryStore::delete_key(const std::string& key) {
  std::lock_guard lock(mutex_);
  return table_->erase(key);
}

std::int64_t MemoryStore::num_keys() {
  std::lock_guard lock(mutex_);
  return static_cast<std::int64_t>(table_->size());
}

void MemoryStore::append(const std::string& key, std::string_view value) {
  {
    std::lock_guard lock(mutex_);
    table_->append(key, value);
  }
  changed_.notify_all();
}

std::vector<std::string> MemoryStore::multi_get(const std::vector<std::string>& keys) {
  std::unique_lock lock(mutex_);
  wait_locked(lock, keys, timeout());
  std::vector<std::string> values;
  values.reserve(keys.size());
  for (const auto& key : keys) values.push_back(*table_->find(key));
  return values;
}

void MemoryStore::multi_set(const std::vector<std::string>& keys,
                            const std::vector<std::string>& values) {
  if (keys.size() != values.size()) throw StoreError("multi_set: keys and values differ in count");
  {
    std::lock_guard lock(mutex_);
    for (std::size_t i = 0; i < keys.size(); ++i) table_->set(keys[i], std::string(values[i]));
  }
  changed_.notify_all();
}

bool MemoryStore::has_all_locked(const std::vector<std::string>& keys) const {
  for (const auto& key : keys) {
    if (!table_->find(key)) return false;
  }
  return true;
}

void MemoryStore::wait_locked(std::unique_lock<std::mutex>& lock,
                              const std::vector<std::string>& keys,
                              std::chrono::milliseconds timeout) {
  if (changed_.wait_for(lock, timeout, [&] { return has_all_locked(keys); })) return;
  std::vector<std::string> missing;
  for (const auto& key : keys) {
    if (!table_->find(key)) missing.push_back(key);
  }
  throw StoreTimeout("memory store: timed out after " + std::to_string(timeout.count()) +
                     " ms waiting for " + describe_keys(missing));
}

}  // namespace ddp::store
