// worker_ranks: the global ranks of one worker from a completed round, as torchrun 2.x's
// SimpleElasticAgent._assign_worker_ranks gives them (members in group-rank order; each role
// counted on its own for ROLE_RANK / ROLE_WORLD_SIZE).
#include "ddp/elastic/rendezvous.hpp"

namespace ddp::elastic {

WorkerRanks worker_ranks(const RoundInfo& round, int local_rank) {
  WorkerRanks ranks;
  const auto self = static_cast<std::size_t>(round.group_rank);
  const std::string& role = self < round.members.size() ? round.members[self].role : "";
  int role_base = 0;
  for (std::size_t i = 0; i < round.members.size(); ++i) {
    const Member& member = round.members[i];
    if (i < self) ranks.rank += member.local_world_size;
    ranks.world_size += member.local_world_size;
    if (member.role != role) continue;
    if (i < self) role_base += member.local_world_size;
    ranks.role_world_size += member.local_world_size;
  }
  ranks.rank += local_rank;
  ranks.role_rank = role_base + local_rank;
  ranks.local_world_size = self < round.members.size() ? round.members[self].local_world_size : 0;
  ranks.group_rank = round.group_rank;
  ranks.group_world_size = static_cast<int>(round.members.size());
  return ranks;
}

}  // namespace ddp::elastic
