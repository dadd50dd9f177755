// Agents sharing their ranks' views through a real store server (in-process): a node that
// stopped publishing has its views age from when it wrote them, and what travels is compact.
#include "agent/collective_exchange.hpp"

#include <catch2/catch.hpp>
#include <chrono>
#include <thread>

#include "ddp/store/client.hpp"
#include "store_fixture.hpp"

using namespace ddp::launcher;
using namespace std::chrono_literals;

namespace {

ddp::elastic::RoundInfo round_of(int group_rank, int nodes, std::uint16_t port) {
  ddp::elastic::RoundInfo round;
  round.round = 0;
  round.group_rank = group_rank;
  round.members.resize(static_cast<std::size_t>(nodes));
  round.master_addr = "127.0.0.1";
  round.master_port = port;
  return round;
}

// A rank that finished `finished` collectives, the last `since` s ago, with 64 recent steps.
RankView view(int rank, std::uint64_t finished, double since) {
  RankView v;
  v.rank = rank;
  v.local_rank = rank % 8;
  v.host = "node-" + std::to_string(rank / 8);
  v.pid = 4000 + rank;
  v.attached = true;
  v.backend = "gloo";
  v.finished = finished;
  v.queued = finished;
  v.since_finished_s = since;
  v.steps = 64;
  for (std::uint64_t s = 1; s <= 64; ++s) v.recent_steps.push_back({s, 0.25, 0.01});
  return v;
}

// Publishes `local` from node 0 every 20 ms until condition holds on what it received from
// the others, for at most timeout; false when it never did.
bool publish_until(CollectiveExchange& node0, const ddp::elastic::RoundInfo& round,
                   const std::vector<RankView>& local,
                   const std::function<bool(const std::vector<RankView>&)>& condition,
                   std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    node0.publish(round, local);
    if (condition(node0.remote())) return true;
    std::this_thread::sleep_for(20ms);
  }
  return false;
}

}  // namespace

TEST_CASE("a node that stopped publishing: its views age from when it wrote them") {
  ddp::test::TestServer server;
  auto quiet = [](const std::string&) {};
  CollectiveExchange node0(quiet, 60s), node1(quiet, 60s);
  const auto round0 = round_of(0, 2, server.port()), round1 = round_of(1, 2, server.port());
  // Node 1's ranks ended (uneven inputs): its last word is "finished 0.4 s ago".
  node1.publish(round1, {view(1, 3, 0.4)});
  RankView waiting = view(0, 3, 0.4);
  waiting.queued = 4;
  const std::vector<RankView> local = {waiting};
  auto since = [](const std::vector<RankView>& remote) {
    return remote.empty() ? -1.0 : remote.front().since_finished_s.value_or(-1.0);
  };
  REQUIRE(publish_until(
      node0, round0, local, [&](const auto& remote) { return since(remote) >= 0; }, 10s));
  const double first = since(node0.remote());
  // However often node 0 reads it again, the view grows older.
  double last = first;
  const bool aged = publish_until(
      node0, round0, local,
      [&](const auto& remote) {
        last = since(remote);
        return last >= first + 1.5;
      },
      15s);
  INFO("first read " << first << " s, last " << last << " s");
  CHECK(aged);
}

TEST_CASE("what a node shares is compact: step history only now and then, kept by the reader") {
  ddp::test::TestServer server;
  auto quiet = [](const std::string&) {};
  CollectiveExchange node0(quiet, 60s), node1(quiet, 60s);
  const auto round0 = round_of(0, 2, server.port()), round1 = round_of(1, 2, server.port());
  auto eight = [](std::uint64_t finished) {
    std::vector<RankView> views;
    for (int r = 8; r < 16; ++r) views.push_back(view(r, finished, 0.1));
    return views;
  };
  auto at = [](std::uint64_t finished) {
    return [finished](const std::vector<RankView>& remote) {
      return remote.size() == 8 && remote.front().finished == finished;
    };
  };
  // The first views of a round carry the steps; the next (a step later) only what changed.
  node1.publish(round1, eight(100));
  REQUIRE(publish_until(node0, round0, {view(0, 100, 0.1)}, at(100), 10s));
  node1.publish(round1, eight(101));
  REQUIRE(publish_until(node0, round0, {view(0, 101, 0.1)}, at(101), 10s));
  for (const RankView& v : node0.remote()) CHECK(v.recent_steps.size() == 64);  // kept
  ddp::store::ClientOptions options;
  options.port = server.port();
  ddp::store::Client client(options);
  const std::string shared = client.get(CollectiveExchange::key(0, 1));
  INFO(shared);
  CHECK(shared.find("recent_steps") == std::string::npos);
  CHECK(shared.size() < 8 * 400);  // 8 ranks; with 64 recent steps each it was ~3.5 KB a rank
}

TEST_CASE("the gatherer judges over every node, and the others follow its verdict, not the views") {
  ddp::test::TestServer server;
  auto quiet = [](const std::string&) {};
  CollectiveExchange node0(quiet, 60s), node1(quiet, 60s);
  const auto round0 = round_of(0, 2, server.port()), round1 = round_of(1, 2, server.port());
  // Rank 0 (node 0) has waited in collective 4 for 100 s; rank 1 (node 1) never entered it.
  RankView waiting = view(0, 3, 100);
  waiting.queued = 4;
  waiting.pending = CollectiveInfo{4, "all_reduce", "float32", 1024, 4096, {}, 100, true};
  const std::vector<RankView> local1 = {view(1, 3, 100)};
  node0.publish(round0, {waiting});
  const auto deadline = std::chrono::steady_clock::now() + 15s;
  std::optional<CollectiveDiagnosis> verdict;
  while (!verdict && std::chrono::steady_clock::now() < deadline) {
    node1.publish(round1, local1);
    verdict = node1.judge(local1, 60);
    if (!verdict) std::this_thread::sleep_for(20ms);
  }
  REQUIRE(verdict);
  CHECK_THAT(verdict->headline, Catch::StartsWith("the job hung at collective 4") &&
                                    Catch::Contains("rank 1 (host node-0, pid 4001) never "
                                                    "entered it"));
  CHECK(verdict->blamed == std::vector<int>{1});
  REQUIRE(verdict->ranks.size() == 1);  // this node's rank
  CHECK(node1.remote().empty());        // node 1 read no other node's views
}

TEST_CASE("no verdict from the gatherer for a while: every node reads the views itself") {
  ddp::test::TestServer server;
  auto quiet = [](const std::string&) {};
  // Three nodes; the gatherer's agent (group rank 0) never shows up.
  CollectiveExchange node1(quiet, 60s), node2(quiet, 60s);
  const auto round1 = round_of(1, 3, server.port()), round2 = round_of(2, 3, server.port());
  RankView waiting = view(1, 3, 100);
  waiting.queued = 4;
  waiting.pending = CollectiveInfo{4, "all_reduce", "float32", 1024, 4096, {}, 100, true};
  const std::vector<RankView> local1 = {waiting}, local2 = {view(2, 3, 100)};
  const auto deadline = std::chrono::steady_clock::now() + kGathererQuiet + 15s;
  std::optional<CollectiveDiagnosis> verdict;
  while (!verdict && std::chrono::steady_clock::now() < deadline) {
    node1.publish(round1, local1);
    node2.publish(round2, local2);
    std::vector<RankView> all = local1;
    for (const RankView& v : node1.remote()) all.push_back(v);
    verdict = node1.judge(all, 60);
    if (!verdict) std::this_thread::sleep_for(20ms);
  }
  REQUIRE(verdict);
  CHECK_THAT(verdict->headline, Catch::Contains("rank 2 (host node-0, pid 4002) never entered"));
  CHECK(node1.remote().size() == 1);
}
