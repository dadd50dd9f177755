// The free functions of the Rendezvous contract (worker_ranks, describe) and the small pure
// pieces under the engine (HeartbeatMonitor, StoreStateBackend over MemoryStore).

#include "ddp/elastic/rendezvous.hpp"

#include <catch2/catch.hpp>
#include <csignal>

#include "ddp/elastic/heartbeat_monitor.hpp"
#include "ddp/elastic/state_backend.hpp"
#include "ddp/store/memory_store.hpp"

using namespace std::chrono_literals;
using namespace ddp::elastic;

namespace {

RoundInfo layout(int group_rank) {
  RoundInfo round;
  round.group_rank = group_rank;
  round.members = {{"a", "ha", "1.1.1.1", 2, "trainer"},
                   {"b", "hb", "1.1.1.2", 3, "ps"},
                   {"c", "hc", "1.1.1.3", 1, "trainer"},
                   {"d", "hd", "1.1.1.4", 4, "ps"}};
  return round;
}

}  // namespace

TEST_CASE("worker ranks: prefix sums by group rank, roles counted apart (torchrun 2.x)") {
  // Group rank 2 ("c", trainer, 1 worker): after a (2) and b (3).
  auto c = worker_ranks(layout(2), 0);
  CHECK(c.rank == 5);
  CHECK(c.world_size == 10);
  CHECK(c.role_rank == 2);  // after a's 2 trainers
  CHECK(c.role_world_size == 3);
  CHECK(c.local_world_size == 1);
  CHECK(c.group_rank == 2);
  CHECK(c.group_world_size == 4);

  // Group rank 3 ("d", ps, 4 workers), local rank 3.
  auto d = worker_ranks(layout(3), 3);
  CHECK(d.rank == 2 + 3 + 1 + 3);
  CHECK(d.role_rank == 3 + 3);  // after b's 3 ps workers
  CHECK(d.role_world_size == 7);
  CHECK(d.local_world_size == 4);

  // Group rank 0, local rank 1.
  auto a = worker_ranks(layout(0), 1);
  CHECK(a.rank == 1);
  CHECK(a.role_rank == 1);
  CHECK(a.role_world_size == 3);
}

TEST_CASE("worker ranks: every global rank appears exactly once") {
  std::vector<int> seen(10, 0);
  for (int g = 0; g < 4; ++g) {
    auto round = layout(g);
    for (int l = 0; l < round.members[g].local_world_size; ++l) {
      ++seen.at(worker_ranks(round, l).rank);
    }
  }
  CHECK(seen == std::vector<int>(10, 1));
}

TEST_CASE("describe: one line per stop reason") {
  StopReason failed;
  failed.kind = StopReason::Kind::kWorkerFailed;
  failed.node_id = "n1";
  failed.host = "gpu01";
  failed.rank = 5;
  failed.local_rank = 1;
  failed.pid = 4242;
  failed.exit_code = 3;
  CHECK(describe(failed) ==
        "worker rank 5 (local rank 1, pid 4242) on node gpu01 (n1) exited "
        "with code 3");
  failed.signal = SIGKILL;
  failed.message = "CUDA out of memory";
  CHECK(describe(failed) ==
        "worker rank 5 (local rank 1, pid 4242) on node gpu01 (n1) was "
        "killed by SIGKILL: CUDA out of memory");

  StopReason lost;
  lost.kind = StopReason::Kind::kNodeLost;
  lost.node_id = "n2";
  lost.host = "gpu02";
  CHECK_THAT(describe(lost), Catch::StartsWith("node gpu02 (n2) was lost"));
  lost.kind = StopReason::Kind::kNodeJoined;
  CHECK_THAT(describe(lost), Catch::Contains("waiting to join"));
  lost.kind = StopReason::Kind::kNodeLeft;
  CHECK(describe(lost) == "node gpu02 (n2) left the job");
}

TEST_CASE("heartbeat monitor: stale only after the budget without a change, on its own clock") {
  HeartbeatMonitor monitor(3s);
  auto t0 = HeartbeatMonitor::Clock::time_point{} + 1h;
  CHECK(monitor.stale({"a"}, t0 + 1h).empty());  // never observed: not judged
  monitor.observe("a", 5, t0);
  monitor.observe("b", 100, t0);
  monitor.observe("a", 5, t0 + 2s);
  monitor.observe("b", 101, t0 + 2s);  // b changed at 2 s
  CHECK(monitor.stale({"a", "b"}, t0 + 2900ms).empty());
  CHECK(monitor.stale({"a", "b"}, t0 + 3s) == std::vector<std::string>{"a"});
  CHECK(monitor.stale({"a", "b"}, t0 + 5s) == std::vector<std::string>{"a", "b"});
  monitor.observe("a", 6, t0 + 5s);
  CHECK(monitor.stale({"a", "b"}, t0 + 5s) == std::vector<std::string>{"b"});
}

TEST_CASE("state backend: compare-and-set on one key per run") {
  ddp::store::MemoryStore store;
  StoreStateBackend one(store, "/ddprun/one/state");
  StoreStateBackend two(store, "/ddprun/two/state");
  CHECK_FALSE(one.get_state());

  auto first = one.set_state("{\"v\":1}", std::nullopt);
  CHECK(first.won);
  auto stale = one.set_state("{\"v\":2}", std::nullopt);  // another node was first
  CHECK_FALSE(stale.won);
  CHECK(stale.bytes == "{\"v\":1}");
  auto next = one.set_state("{\"v\":3}", stale.token);
  CHECK(next.won);
  auto read = one.get_state();
  REQUIRE(read);
  CHECK(read->bytes == "{\"v\":3}");
  CHECK_FALSE(one.set_state("{\"v\":4}", first.token).won);  // a token from before

  CHECK_FALSE(two.get_state());  // another run id: another state
  CHECK(two.set_state("{\"v\":9}", std::nullopt).won);
  CHECK(one.get_state()->bytes == "{\"v\":3}");
}
