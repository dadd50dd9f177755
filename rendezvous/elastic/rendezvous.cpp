// The free functions of the Rendezvous contract: worker ranks and stop reasons for humans.

#include "ddp/elastic/rendezvous.hpp"

#include <csignal>
#include <cstring>

namespace ddp::elastic {
namespace {

std::string node_text(const StopReason& reason) {
  std::string host = reason.host.empty() ? std::string("?") : reason.host;
  if (reason.node_id.empty()) return "node " + host;
  return "node " + host + " (" + reason.node_id + ")";
}

std::string signal_text(int signal) {
  const char* abbrev = signal > 0 && signal < NSIG ? ::sigabbrev_np(signal) : nullptr;
  return abbrev ? "SIG" + std::string(abbrev) : "signal " + std::to_string(signal);
}

std::string worker_failure(const StopReason& reason) {
  std::string text = "worker rank " + std::to_string(reason.rank) + " (local rank " +
                     std::to_string(reason.local_rank) + ", pid " + std::to_string(reason.pid) +
                     ") on " + node_text(reason);
  if (reason.signal != 0) {
    text += " was killed by " + signal_text(reason.signal);
  } else {
    text += " exited with code " + std::to_string(reason.exit_code);
  }
  return text;
}

}  // namespace

// torchrun 2.x (_assign_worker_ranks): the nodes in group-rank order, each contributing its
// local world size to the global prefix sum and to the prefix sum of its role.
WorkerRanks worker_ranks(const RoundInfo& round, int local_rank) {
  WorkerRanks ranks;
  ranks.group_rank = round.group_rank;
  ranks.group_world_size = static_cast<int>(round.members.size());
  const std::string& role = round.members.at(round.group_rank).role;
  int base = 0;
  int role_base = 0;
  for (int i = 0; i < ranks.group_world_size; ++i) {
    const Member& member = round.members[i];
    if (i < round.group_rank) {
      base += member.local_world_size;
      if (member.role == role) role_base += member.local_world_size;
    }
    ranks.world_size += member.local_world_size;
    if (member.role == role) ranks.role_world_size += member.local_world_size;
  }
  ranks.local_world_size = round.members[round.group_rank].local_world_size;
  ranks.rank = base + local_rank;
  ranks.role_rank = role_base + local_rank;
  return ranks;
}

std::string describe(const StopReason& reason) {
  std::string text;
  switch (reason.kind) {
    case StopReason::Kind::kWorkerFailed:
    case StopReason::Kind::kHung:
      text = worker_failure(reason);
      break;
    case StopReason::Kind::kNodeLost:
      text = reason.node_id.empty()
                 ? std::string("the rendezvous store was lost")
                 : node_text(reason) + " was lost (its agent stopped sending heartbeats)";
      break;
    case StopReason::Kind::kNodeJoined:
      text = node_text(reason) + " is waiting to join: restarting into a larger world";
      break;
    case StopReason::Kind::kNodeLeft:
      text = node_text(reason) + " left the job";
      break;
  }
  if (!reason.message.empty()) text += ": " + reason.message;
  return text;
}

}  // namespace ddp::elastic
