#pragma once
// The server's data: keys and values, queues, pending waits and 1.x watches. No sockets:
// the connections talk to it through the Subscriber interface. Single-threaded: only the
// server's event loop touches it.

#include <cstdint>
#include <deque>
#include <list>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace ddp::store {

class Subscriber;
struct Waiter;

// A waiter's place in one key's queue of waiters, and which of its slots it fills.
struct WaitEntry {
  Waiter* waiter;
  std::size_t slot;
};
using WaitList = std::list<WaitEntry>;

// One key a waiter is registered on: its entry in that key's list, so that removing it
// costs O(1) however many others wait on the key.
struct WaitSlot {
  std::string key;
  WaitList::iterator entry;
  bool active = false;  // false once the key appeared (its entry is gone)
};

// One pending WAIT: answered when `remaining` reaches zero. The table keeps pointers to
// it while registered: its owner must cancel_wait() before destroying it.
struct Waiter {
  Subscriber* owner = nullptr;
  std::size_t remaining = 0;
  std::vector<WaitSlot> slots;  // the keys it was registered on
};

// The side of a connection the table calls back into.
class Subscriber {
 public:
  // Every key of the wait now exists; the waiter is no longer registered anywhere.
  virtual void on_wait_done(Waiter& waiter) = 0;
  // A watched key changed (1.x WATCH_KEY): event code, key, old and new value.
  virtual void on_key_event(std::uint8_t event, std::string_view key, std::string_view old_value,
                            std::string_view new_value) = 0;

 protected:
  ~Subscriber() = default;
};

struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept {
    return std::hash<std::string_view>{}(s);
  }
};
template <typename V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

class StoreTable {
 public:
  const std::string* find(std::string_view key) const;
  // A key exists for CHECK and WAIT when it holds a value or a non-empty queue.
  bool present(std::string_view key) const;
  std::size_t size() const { return data_.size(); }
  // Bytes of every key, value and queued element held now.
  std::size_t stored_bytes() const { return stored_bytes_; }
  // How much stored_bytes() would grow at most if key were set to a value of value_bytes.
  std::size_t set_growth(std::string_view key, std::size_t value_bytes) const;
  // The same for appending bytes to key, and for pushing a value of value_bytes to its queue.
  std::size_t append_growth(std::string_view key, std::size_t bytes) const;
  std::size_t push_growth(std::string_view key, std::size_t value_bytes) const;

  void set(std::string_view key, std::string&& value);
  // The new value; nullopt (and nothing changed) when the key holds no decimal integer.
  std::optional<std::int64_t> add(std::string_view key, std::int64_t delta);
  // PyTorch's COMPARE_SET; returns the value to answer with.
  std::string compare_set(std::string_view key, std::string&& expected, std::string&& desired);
  bool erase(std::string_view key);
  // Drops every value and queue (waiters and watchers stay registered): a store made new.
  void clear_values();
  // Drops every value and queue whose key starts with none of `keep` (watchers are told, as
  // by erase); returns how many keys went.
  std::size_t erase_all_but(const std::vector<std::string>& keep);
  void append(std::string_view key, std::string_view bytes);

  void queue_push(std::string_view key, std::string&& value);
  // The length before the pop, and the popped value when it was > 0.
  std::int64_t queue_pop(std::string_view key, std::string& value);
  std::int64_t queue_len(std::string_view key) const;

  // Registers waiter on every missing key; false when none is missing (nothing registered).
  bool begin_wait(Waiter& waiter, const std::vector<std::string>& keys, std::size_t count);
  // Removes waiter from every key it is still registered on: O(keys of the waiter).
  void cancel_wait(Waiter& waiter);
  std::size_t waiter_registrations() const { return registrations_; }

  void watch(std::string_view key, Subscriber& subscriber);
  void unwatch(std::string_view key, Subscriber& subscriber);

 private:
  void changed(std::string_view key, std::uint8_t event, std::string_view old_value,
               std::string_view new_value, bool created);
  void wake_all(std::string_view key);
  void wake_one(std::string_view key);
  // Counts one key of entry's waiter as present; answers the waiter when it was the last.
  void satisfy(const WaitEntry& entry);
  void notify_watchers(std::uint8_t event, std::string_view key, std::string_view old_value,
                       std::string_view new_value);

  StringMap<std::string> data_;
  StringMap<std::deque<std::string>> queues_;
  StringMap<WaitList> waiters_;
  StringMap<std::vector<Subscriber*>> watchers_;
  std::size_t registrations_ = 0;
  std::size_t stored_bytes_ = 0;
};

}  // namespace ddp::store
