#include "ddp/store/memory_store.hpp"

#include "ddp/store/store_util.hpp"

namespace ddp::store {

void MemoryStore::set(const std::string& key, std::string_view value) {
  {
    std::lock_guard lock(mutex_);
    data_[key] = std::string(value);
  }
  changed_.notify_all();
}

std::string MemoryStore::get(const std::string& key) {
  std::unique_lock lock(mutex_);
  wait_locked(lock, {key}, timeout());
  return data_.find(key)->second;
}

std::int64_t MemoryStore::add(const std::string& key, std::int64_t delta) {
  std::int64_t value = 0;
  {
    std::lock_guard lock(mutex_);
    auto it = data_.find(key);
    if (it != data_.end()) {
      auto current = parse_counter(it->second);
      if (!current) throw StoreError("add: key '" + key + "' does not hold an integer");
      value = *current;
    }
    // Wraps on overflow like the server's ADD instead of being undefined.
    value = static_cast<std::int64_t>(static_cast<std::uint64_t>(value) +
                                      static_cast<std::uint64_t>(delta));
    data_[key] = std::to_string(value);
  }
  changed_.notify_all();
  return value;
}

std::string MemoryStore::compare_set(const std::string& key, std::string_view expected,
                                     std::string_view desired) {
  std::string result;
  {
    std::lock_guard lock(mutex_);
    auto it = data_.find(key);
    if (it == data_.end()) {
      if (!expected.empty()) return std::string(expected);
      result = data_[key] = std::string(desired);
    } else if (it->second == expected) {
      result = it->second = std::string(desired);
    } else {
      return it->second;
    }
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
  return data_.erase(key) > 0;
}

std::int64_t MemoryStore::num_keys() {
  std::lock_guard lock(mutex_);
  return static_cast<std::int64_t>(data_.size());
}

void MemoryStore::append(const std::string& key, std::string_view value) {
  {
    std::lock_guard lock(mutex_);
    data_[key].append(value);
  }
  changed_.notify_all();
}

std::vector<std::string> MemoryStore::multi_get(const std::vector<std::string>& keys) {
  std::unique_lock lock(mutex_);
  wait_locked(lock, keys, timeout());
  std::vector<std::string> values;
  values.reserve(keys.size());
  for (const auto& key : keys) values.push_back(data_.find(key)->second);
  return values;
}

void MemoryStore::multi_set(const std::vector<std::string>& keys,
                            const std::vector<std::string>& values) {
  if (keys.size() != values.size()) throw StoreError("multi_set: keys and values differ in count");
  {
    std::lock_guard lock(mutex_);
    for (std::size_t i = 0; i < keys.size(); ++i) data_[keys[i]] = values[i];
  }
  changed_.notify_all();
}

bool MemoryStore::has_all_locked(const std::vector<std::string>& keys) const {
  for (const auto& key : keys) {
    if (data_.find(key) == data_.end()) return false;
  }
  return true;
}

void MemoryStore::wait_locked(std::unique_lock<std::mutex>& lock,
                              const std::vector<std::string>& keys,
                              std::chrono::milliseconds timeout) {
  if (changed_.wait_for(lock, timeout, [&] { return has_all_locked(keys); })) return;
  std::vector<std::string> missing;
  for (const auto& key : keys) {
    if (data_.find(key) == data_.end()) missing.push_back(key);
  }
  throw StoreTimeout("memory store: timed out after " + std::to_string(timeout.count()) +
                     " ms waiting for " + describe_keys(missing));
}

}  // namespace ddp::store
