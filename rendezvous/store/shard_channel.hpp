#pragma once
// What passes between the server's loop and one connection shard (shard.hpp): commands one
// way, events the other, each in a mutex-guarded queue, and the doorbell message that wakes
// the other side on their socketpair.

#include <sys/socket.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace ddp::store {

// What the server's loop asks of a shard.
struct ShardCommand {
  enum class Kind : std::uint8_t { kRead, kWrite, kClose, kStop };
  Kind kind;
  std::uint64_t id = 0;
  std::string bytes;  // kWrite: what to write
};

// What a shard tells the server's loop.
struct ShardEvent {
  enum class Kind : std::uint8_t { kReceived, kSent, kClosed, kFailed };
  Kind kind;
  std::uint64_t id = 0;
  std::string bytes;  // kReceived: what was read; kClosed, kFailed: why, unless an ordinary end
};

// The two queues between the server's loop and one shard. It holds no descriptor, so either
// thread may be the one to destroy it.
struct ShardChannel {
  // Each push returns whether the queue was empty: then the pusher rings the doorbell (the
  // taker empties the queue after reading its doorbells, so no item is left unrung).
  bool push(ShardCommand command) {
    std::lock_guard lock(command_mutex);
    commands.push_back(std::move(command));
    return commands.size() == 1;
  }
  bool push(ShardEvent event) {
    std::lock_guard lock(event_mutex);
    events.push_back(std::move(event));
    return events.size() == 1;
  }
  // Swaps the queue into `into` (cleared first), so that both keep their capacity.
  void take(std::vector<ShardCommand>& into) {
    into.clear();
    std::lock_guard lock(command_mutex);
    std::swap(into, commands);
  }
  void take(std::vector<ShardEvent>& into) {
    into.clear();
    std::lock_guard lock(event_mutex);
    std::swap(into, events);
  }

  std::mutex command_mutex;
  std::vector<ShardCommand> commands;
  std::mutex event_mutex;
  std::vector<ShardEvent> events;
};

// A socketpair message that only wakes the other side; others carry a connection's id.
inline constexpr std::uint64_t kDoorbell = 0;

// Sends a doorbell on fd, never blocking: when the pair is full, the other side has messages
// to wake it already.
inline void ring_on(int fd) {
  const std::uint64_t bell = kDoorbell;
  ::send(fd, &bell, sizeof bell, MSG_DONTWAIT | MSG_NOSIGNAL);
}

}  // namespace ddp::store
