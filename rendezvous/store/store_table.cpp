#include "store_table.hpp"

#include <algorithm>
#include <utility>

#include "ddp/store/store_util.hpp"
#include "ddp/store/wire_codec.hpp"

namespace ddp::store {

const std::string* StoreTable::find(std::string_view key) const {
  auto it = data_.find(key);
  return it == data_.end() ? nullptr : &it->second;
}

bool StoreTable::present(std::string_view key) const {
  if (data_.find(key) != data_.end()) return true;
  auto q = queues_.find(key);
  return q != queues_.end() && !q->second.empty();
}

std::size_t StoreTable::set_growth(std::string_view key, std::size_t value_bytes) const {
  const std::string* current = find(key);
  if (!current) return key.size() + value_bytes;
  return value_bytes > current->size() ? value_bytes - current->size() : 0;
}

std::size_t StoreTable::append_growth(std::string_view key, std::size_t bytes) const {
  return find(key) ? bytes : key.size() + bytes;
}

std::size_t StoreTable::push_growth(std::string_view key, std::size_t value_bytes) const {
  return queues_.find(key) != queues_.end() ? value_bytes : key.size() + value_bytes;
}

void StoreTable::set(std::string_view key, std::string&& value) {
  auto it = data_.find(key);
  if (it == data_.end()) {
    it = data_.emplace(std::string(key), std::move(value)).first;
    stored_bytes_ += key.size() + it->second.size();
    changed(key, kWatchKeyCreated, {}, it->second, true);
    return;
  }
  stored_bytes_ = stored_bytes_ - it->second.size() + value.size();
  if (watchers_.empty()) {
    it->second = std::move(value);
    changed(key, kWatchKeyUpdated, {}, it->second, false);
    return;
  }
  std::string old = std::exchange(it->second, std::move(value));
  changed(key, kWatchKeyUpdated, old, it->second, false);
}

std::optional<std::int64_t> StoreTable::add(std::string_view key, std::int64_t delta) {
  auto it = data_.find(key);
  if (it == data_.end()) {
    set(key, std::to_string(delta));
    return delta;
  }
  auto current = parse_counter(it->second);
  if (!current) return std::nullopt;
  // Wraps on overflow like two's complement instead of being undefined.
  auto sum = static_cast<std::int64_t>(static_cast<std::uint64_t>(*current) +
                                       static_cast<std::uint64_t>(delta));
  set(key, std::to_string(sum));
  return sum;
}

std::string StoreTable::compare_set(std::string_view key, std::string&& expected,
                                    std::string&& desired) {
  auto it = data_.find(key);
  if (it == data_.end()) {
    if (!expected.empty()) return std::move(expected);
    std::string reply = desired;
    set(key, std::move(desired));
    return reply;
  }
  if (it->second != expected) return it->second;
  std::string reply = desired;
  set(key, std::move(desired));
  return reply;
}

void StoreTable::clear_values() {
  data_.clear();
  queues_.clear();
  stored_bytes_ = 0;
}

std::size_t StoreTable::erase_all_but(const std::vector<std::string>& keep) {
  auto kept = [&keep](std::string_view key) {
    for (const std::string& prefix : keep) {
      if (key.starts_with(prefix)) return true;
    }
    return false;
  };
  std::vector<std::string> going;
  for (const auto& [key, value] : data_) {
    if (!kept(key)) going.push_back(key);
  }
  for (const std::string& key : going) erase(key);
  std::size_t gone = going.size();
  for (auto it = queues_.begin(); it != queues_.end();) {
    if (kept(it->first)) {
      ++it;
      continue;
    }
    stored_bytes_ -= it->first.size();
    for (const std::string& element : it->second) stored_bytes_ -= element.size();
    it = queues_.erase(it);
    ++gone;
  }
  return gone;
}

bool StoreTable::erase(std::string_view key) {
  auto it = data_.find(key);
  if (it == data_.end()) return false;
  stored_bytes_ -= it->first.size() + it->second.size();
  if (watchers_.find(key) != watchers_.end()) {
    std::string old = std::move(it->second);
    data_.erase(it);
    notify_watchers(kWatchKeyDeleted, key, old, {});
    return true;
  }
  data_.erase(it);
  return true;
}

void StoreTable::append(std::string_view key, std::string_view bytes) {
  auto it = data_.find(key);
  if (it == data_.end()) {
    set(key, std::string(bytes));
    return;
  }
  std::string old = watchers_.empty() ? std::string() : it->second;
  it->second.append(bytes);
  stored_bytes_ += bytes.size();
  changed(key, kWatchKeyUpdated, old, it->second, false);
}

void StoreTable::queue_push(std::string_view key, std::string&& value) {
  auto it = queues_.find(key);
  if (it == queues_.end()) {
    it = queues_.emplace(std::string(key), std::deque<std::string>()).first;
    stored_bytes_ += key.size();
  }
  stored_bytes_ += value.size();
  it->second.push_back(std::move(value));
  wake_one(key);
}

std::int64_t StoreTable::queue_pop(std::string_view key, std::string& value) {
  auto it = queues_.find(key);
  if (it == queues_.end() || it->second.empty()) return 0;
  auto length = static_cast<std::int64_t>(it->second.size());
  value = std::move(it->second.front());
  it->second.pop_front();
  stored_bytes_ -= value.size();
  if (it->second.empty()) {
    stored_bytes_ -= it->first.size();
    queues_.erase(it);
  }
  return length;
}

std::int64_t StoreTable::queue_len(std::string_view key) const {
  auto it = queues_.find(key);
  return it == queues_.end() ? 0 : static_cast<std::int64_t>(it->second.size());
}

bool StoreTable::begin_wait(Waiter& waiter, const std::vector<std::string>& keys,
                            std::size_t count) {
  waiter.remaining = 0;
  waiter.slots.clear();
  for (std::size_t i = 0; i < count; ++i) {
    if (present(keys[i])) continue;
    auto it = waiters_.find(keys[i]);
    if (it == waiters_.end()) it = waiters_.emplace(keys[i], WaitList()).first;
    auto entry = it->second.insert(it->second.end(), WaitEntry{&waiter, waiter.slots.size()});
    waiter.slots.push_back(WaitSlot{keys[i], entry, true});
    ++waiter.remaining;
    ++registrations_;
  }
  return waiter.remaining > 0;
}

void StoreTable::cancel_wait(Waiter& waiter) {
  for (auto& slot : waiter.slots) {
    if (!slot.active) continue;
    auto it = waiters_.find(slot.key);
    it->second.erase(slot.entry);
    --registrations_;
    if (it->second.empty()) waiters_.erase(it);
  }
  waiter.slots.clear();
  waiter.remaining = 0;
}

void StoreTable::watch(std::string_view key, Subscriber& subscriber) {
  auto it = watchers_.find(key);
  if (it == watchers_.end())
    it = watchers_.emplace(std::string(key), std::vector<Subscriber*>()).first;
  it->second.push_back(&subscriber);
}

void StoreTable::unwatch(std::string_view key, Subscriber& subscriber) {
  auto it = watchers_.find(key);
  if (it == watchers_.end()) return;
  auto& list = it->second;
  list.erase(std::remove(list.begin(), list.end(), &subscriber), list.end());
  if (list.empty()) watchers_.erase(it);
}

void StoreTable::changed(std::string_view key, std::uint8_t event, std::string_view old_value,
                         std::string_view new_value, bool created) {
  if (created || !waiters_.empty()) wake_all(key);
  if (!watchers_.empty()) notify_watchers(event, key, old_value, new_value);
}

void StoreTable::wake_all(std::string_view key) {
  auto it = waiters_.find(key);
  if (it == waiters_.end()) return;
  WaitList list = std::move(it->second);
  waiters_.erase(it);
  registrations_ -= list.size();
  // A waiter is answered (and may be destroyed) at its last entry, never before.
  for (const WaitEntry& entry : list) satisfy(entry);
}

void StoreTable::wake_one(std::string_view key) {
  auto it = waiters_.find(key);
  if (it == waiters_.end()) return;
  WaitEntry entry = it->second.front();
  it->second.pop_front();
  --registrations_;
  if (it->second.empty()) waiters_.erase(it);
  satisfy(entry);
}

void StoreTable::satisfy(const WaitEntry& entry) {
  Waiter& waiter = *entry.waiter;
  waiter.slots[entry.slot].active = false;
  if (--waiter.remaining > 0) return;
  waiter.slots.clear();
  waiter.owner->on_wait_done(waiter);
}

void StoreTable::notify_watchers(std::uint8_t event, std::string_view key,
                                 std::string_view old_value, std::string_view new_value) {
  auto it = watchers_.find(key);
  if (it == watchers_.end()) return;
  for (Subscriber* subscriber : it->second) {
    subscriber->on_key_event(event, key, old_value, new_value);
  }
}

}  // namespace ddp::store
