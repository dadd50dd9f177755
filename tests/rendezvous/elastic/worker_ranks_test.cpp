// worker_ranks: torchrun 2.x's rank assignment (_assign_worker_ranks) from a RoundInfo.
#include <catch2/catch.hpp>

#include "ddp/elastic/rendezvous.hpp"

using namespace ddp::elastic;

namespace {

RoundInfo round_of(std::vector<std::pair<int, std::string>> nodes, int group_rank) {
  RoundInfo round;
  round.group_rank = group_rank;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    round.members.push_back(
        Member{"n" + std::to_string(i), "h", "", nodes[i].first, nodes[i].second});
  }
  return round;
}

}  // namespace

TEST_CASE("one node: the local rank is the rank") {
  WorkerRanks r = worker_ranks(round_of({{4, "default"}}, 0), 3);
  CHECK(r.rank == 3);
  CHECK(r.world_size == 4);
  CHECK(r.role_rank == 3);
  CHECK(r.role_world_size == 4);
  CHECK(r.local_world_size == 4);
  CHECK(r.group_rank == 0);
  CHECK(r.group_world_size == 1);
}

TEST_CASE("nodes with different local world sizes: ranks are prefix sums in group-rank order") {
  auto round = round_of({{2, "default"}, {3, "default"}, {1, "default"}}, 1);
  WorkerRanks r = worker_ranks(round, 2);
  CHECK(r.rank == 4);  // 2 workers of group rank 0, then local rank 2
  CHECK(r.world_size == 6);
  CHECK(r.role_rank == 4);
  CHECK(r.role_world_size == 6);
  CHECK(r.local_world_size == 3);
  CHECK(r.group_rank == 1);
  CHECK(r.group_world_size == 3);
  round.group_rank = 2;
  CHECK(worker_ranks(round, 0).rank == 5);
}

TEST_CASE("roles are counted among members of the same role only") {
  auto round = round_of({{2, "trainer"}, {1, "reader"}, {2, "trainer"}, {1, "reader"}}, 2);
  WorkerRanks trainer = worker_ranks(round, 1);
  CHECK(trainer.rank == 4);  // 2 + 1 + 1
  CHECK(trainer.world_size == 6);
  CHECK(trainer.role_rank == 3);  // 2 trainers before it + 1
  CHECK(trainer.role_world_size == 4);
  round.group_rank = 3;
  WorkerRanks reader = worker_ranks(round, 0);
  CHECK(reader.rank == 5);
  CHECK(reader.role_rank == 1);
  CHECK(reader.role_world_size == 2);
}
