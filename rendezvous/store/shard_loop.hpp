#pragma once
// The thread of a connection shard (shard.hpp): it gives itself a descriptor table of its
// own, keeps only its end of the socketpair, and runs an event loop over the sockets handed
// to it. Nothing here is touched from another thread but the channel.

#include <cstddef>
#include <future>
#include <memory>
#include <string>

#include "shard_channel.hpp"

namespace ddp::store {

// Descriptors of a shard's table that are not connections: stdio, its end of the socketpair,
// its event loop's, and a margin.
inline constexpr std::size_t kShardOwnDescriptors = 32;

// How a shard's thread started: empty error when it runs.
struct ShardStart {
  std::string error;
  bool unsupported = false;  // never will here (unshare refused)
};

// The shard thread's body: blocks every signal, unshares the descriptor table, closes the
// copies of the process's descriptors but stdio and pair_fd, reports through ready, then
// serves until the channel says stop (or reports kFailed).
void run_shard(const std::shared_ptr<ShardChannel>& channel, int pair_fd,
               std::promise<ShardStart> ready);

}  // namespace ddp::store
