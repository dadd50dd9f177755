// LocalRendezvous: the one-node rendezvous of --nnodes=1, in-process.
#include "host/local_rendezvous.hpp"

#include <catch2/catch.hpp>

using namespace ddp::launcher;
using ddp::elastic::RoundInfo;
using ddp::elastic::StopReason;

namespace {

RoundInfo next(LocalRendezvous& rdzv) {
  std::optional<RoundInfo> got;
  rdzv.next_round(
      0, [&](RoundInfo r) { got = std::move(r); }, nullptr, nullptr);
  REQUIRE(got);  // at once
  return *got;
}

}  // namespace

TEST_CASE("every round closes at once with this node alone, at the given master") {
  ddp::elastic::NodeInfo self{"id", "host", "", 3, "trainer", std::nullopt};
  LocalRendezvous rdzv(self, "127.0.0.1", 29511);
  RoundInfo first = next(rdzv);
  CHECK(first.round == 0);
  CHECK(first.restart_count == 0);
  CHECK(first.group_rank == 0);
  REQUIRE(first.members.size() == 1);
  CHECK(first.members[0].node_id == "id");
  CHECK(first.members[0].local_world_size == 3);
  CHECK(first.members[0].role == "trainer");
  CHECK(first.master_addr == "127.0.0.1");
  CHECK(first.master_port == 29511);
  bool done = false;
  rdzv.finish_round([&](bool ok) { done = ok; });
  CHECK(done);
}

TEST_CASE("a worker failure counts a restart and another stop does not") {
  LocalRendezvous rdzv({"id", "host", "", 1, "default", std::nullopt}, "a", 1);
  next(rdzv);
  std::optional<StopReason> seen;
  rdzv.watch_round([&](StopReason r) { seen = r; });
  StopReason failed;
  failed.kind = StopReason::Kind::kWorkerFailed;
  failed.rank = 0;
  rdzv.stop_round(failed);
  REQUIRE(seen);  // its own reason comes back to the watcher, at once
  CHECK(seen->kind == StopReason::Kind::kWorkerFailed);
  RoundInfo second = next(rdzv);
  CHECK(second.round == 1);
  CHECK(second.restart_count == 1);
  StopReason left;
  left.kind = StopReason::Kind::kNodeLeft;
  rdzv.stop_round(left);
  CHECK(next(rdzv).restart_count == 1);
}
