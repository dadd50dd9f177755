#pragma once
// What passes between the server's loop and one connection shard (shard.hpp): commands one
// way, events the other, each in a mutex-guarded queue, and the doorbell message that wakes
// the other side on their socketpair.

#include <sys/socket.h>

#include <array>
#include <cerrno>
#include <cstdint>
#include <cstring>
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

// The buffers of one message on the pair, for sendmsg and recvmsg: `id` as its data, and
// room for one descriptor (SCM_RIGHTS). It points into itself and at `id`: never copied.
struct PairMessage {
  explicit PairMessage(std::uint64_t& id) : data{&id, sizeof id} {
    header.msg_iov = &data;
    header.msg_iovlen = 1;
    header.msg_control = control.data();
    header.msg_controllen = control.size();
  }
  PairMessage(const PairMessage&) = delete;
  PairMessage& operator=(const PairMessage&) = delete;

  iovec data;
  alignas(cmsghdr) std::array<char, CMSG_SPACE(sizeof(int))> control{};
  msghdr header{};
};

// Sends one connection's id with its socket (SCM_RIGHTS) on the pair, never blocking.
// Returns sendmsg's result (-1 with errno: EAGAIN when the pair is full).
inline ssize_t send_socket(int pair, std::uint64_t id, int socket) {
  PairMessage message(id);
  cmsghdr* header = CMSG_FIRSTHDR(&message.header);
  header->cmsg_level = SOL_SOCKET;
  header->cmsg_type = SCM_RIGHTS;
  header->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(header), &socket, sizeof socket);
  ssize_t n = 0;
  do {
    n = ::sendmsg(pair, &message.header, MSG_DONTWAIT | MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  return n;
}

// One message read from the pair: a doorbell (id kDoorbell), or a connection's id with its
// socket (socket -1 when it did not come: `truncated` when the receiver's descriptor table was
// full).
struct ReceivedSocket {
  std::uint64_t id = kDoorbell;
  int socket = -1;
  bool truncated = false;
};

// Reads one message from the pair, never blocking; the socket comes close-on-exec. Returns
// recvmsg's result (0: the other end closed; -1 with errno: EAGAIN when none is waiting).
inline ssize_t receive_socket(int pair, ReceivedSocket& into) {
  into = ReceivedSocket{};
  PairMessage message(into.id);
  ssize_t n = 0;
  do {
    n = ::recvmsg(pair, &message.header, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n <= 0) return n;
  for (cmsghdr* c = CMSG_FIRSTHDR(&message.header); c != nullptr;
       c = CMSG_NXTHDR(&message.header, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      std::memcpy(&into.socket, CMSG_DATA(c), sizeof into.socket);
    }
  }
  into.truncated = (message.header.msg_flags & MSG_CTRUNC) != 0;
  return n;
}

}  // namespace ddp::store
