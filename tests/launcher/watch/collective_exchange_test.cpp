// Agents sharing their ranks' views through a real store server (in-process): a node that
// stopped publishing has its views age from when it wrote them, what travels is compact, the
// gatherer's requests a tick do not grow with the nodes, and a gatherer that is gone is
// replaced by the next group rank.
#include "watch/collective_exchange.hpp"

#include <catch2/catch.hpp>
#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "ddp/store/client.hpp"
#include "store_fixture.hpp"
#include "watch/collective_keys.hpp"
#include "watch/views_writer.hpp"

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

TEST_CASE(
    "no verdict from the gatherer for a while: the next group rank gathers, the other follows") {
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
  CHECK(node1.remote().size() == 1);  // node 1 gathers
  // Node 2 follows node 1's verdict (it would take over only after node 1 were quiet too).
  std::optional<CollectiveDiagnosis> followed;
  while (!followed && std::chrono::steady_clock::now() < deadline) {
    node2.publish(round2, local2);
    followed = node2.judge(local2, 60);
    if (!followed) std::this_thread::sleep_for(20ms);
  }
  REQUIRE(followed);
  CHECK(followed->headline == verdict->headline);
  CHECK(node2.remote().empty());
}

namespace {

// A rank that finished `finished` collectives and waits in the next one (unless absent: it
// never entered it), both for waited_s.
RankView rank_at(int rank, std::uint64_t finished, double waited_s, bool absent = false) {
  RankView v = view(rank, finished, waited_s);
  if (absent) return v;
  v.queued = finished + 1;
  v.pending = CollectiveInfo{finished + 1, "all_reduce", "float32", 1024, 4096, {}, waited_s, true};
  return v;
}

// A node's 8 ranks, in training (a step a tick) or in a hang of 100 s where `blocked` never
// entered the collective the others wait in.
std::vector<RankView> node_ranks(int g, std::uint64_t step, std::optional<int> blocked) {
  std::vector<RankView> views;
  for (int r = g * 8; r < g * 8 + 8; ++r) {
    views.push_back(blocked ? rank_at(r, step, 100, r == *blocked) : rank_at(r, step, 0.01));
  }
  return views;
}

// The gatherer (node 0, real) of `nodes` nodes whose others (1..) the test writes as agents do
// (ViewsWriter), through one client; the store's own count of requests, less the test's,
// gives the gatherer's, and its verdict's count its ticks.
class GathererRig {
 public:
  explicit GathererRig(int nodes)
      : nodes_(nodes),
        gatherer_([](const std::string&) {}, 60s),
        client_(client_options(server_.port())),
        probe_(client_options(server_.port())),
        writers_(static_cast<std::size_t>(nodes)) {}

  // One tick: every node's views written (the others' by the test), then the gatherer's tick
  // awaited (its verdict's count moves).
  void tick(std::uint64_t step, std::optional<int> blocked = {}) {
    const std::int64_t count = ticks();
    for (int g = 1; g < nodes_; ++g) {
      if (writers_[static_cast<std::size_t>(g)].write(client_, round_of(g, nodes_, server_.port()),
                                                      node_ranks(g, step, blocked))) {
        ++test_requests_;  // one MULTI_SET
      }
    }
    gatherer_.publish(round_of(0, nodes_, server_.port()), node_ranks(0, step, blocked));
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (ticks() == count && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(2ms);
    }
  }
  // The gatherer's ticks so far (its verdicts written).
  std::int64_t ticks() {
    ++test_requests_;
    return probe_.add(verdict_count_key(0), 0);
  }
  // Requests to the store so far, but for the test's own.
  std::int64_t gatherer_requests() { return server_.stats().requests - test_requests_; }
  std::optional<CollectiveDiagnosis> judge(std::uint64_t step, std::optional<int> blocked) {
    return gatherer_.judge(node_ranks(0, step, blocked), 60);
  }
  // The verdict as the other agents read it.
  nlohmann::json verdict() {
    ++test_requests_;
    return nlohmann::json::parse(probe_.get(verdict_key(0)));
  }

 private:
  static ddp::store::ClientOptions client_options(std::uint16_t port) {
    ddp::store::ClientOptions options;
    options.port = port;
    return options;
  }
  int nodes_;
  ddp::test::TestServer server_;
  CollectiveExchange gatherer_;
  ddp::store::Client client_, probe_;
  std::vector<ViewsWriter> writers_;
  std::int64_t test_requests_ = 0;
};

struct Measured {
  double training = 0;  // the gatherer's requests a tick while every node's views change
  double hang = 0;      // while one rank of the job blocks the others and nothing changes
  std::optional<CollectiveDiagnosis> verdict;
  nlohmann::json shared;      // the verdict the others read
  std::uint64_t hung_at = 0;  // the collective the job hung at
};

// The gatherer's requests a tick over `ticks` ticks from now, tick(step) making them.
double requests_a_tick(GathererRig& rig, int ticks, const std::function<void()>& tick) {
  const std::int64_t requests = rig.gatherer_requests(), first = rig.ticks();
  for (int i = 0; i < ticks; ++i) tick();
  const std::int64_t done = rig.ticks() - first;
  REQUIRE(done >= ticks);
  return static_cast<double>(rig.gatherer_requests() - requests) / static_cast<double>(done);
}

Measured measure_gatherer(int nodes, int blocked) {
  GathererRig rig(nodes);
  Measured m;
  std::uint64_t step = 100;
  for (int i = 0; i < 3; ++i) rig.tick(++step);  // each node's progress key made, read once
  m.training = requests_a_tick(rig, 6, [&] { rig.tick(++step); });
  // Rank `blocked` never enters the next collective; every other rank has waited in it 100 s.
  ++step;
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (!m.verdict && std::chrono::steady_clock::now() < deadline) {
    rig.tick(step, blocked);
    m.verdict = rig.judge(step, blocked);
  }
  m.hang = requests_a_tick(rig, 6, [&] { rig.tick(step, blocked); });
  m.shared = rig.verdict();
  m.hung_at = step + 1;
  return m;
}

}  // namespace

TEST_CASE("the gatherer's requests a tick do not grow with the nodes, in training or a hang") {
  // 50 and 200 nodes of 8 ranks; one rank of the job blocks the others.
  const Measured small = measure_gatherer(50, 203), large = measure_gatherer(200, 1203);
  INFO("a tick: 50 nodes " << small.training << " requests in training, " << small.hang
                           << " in a hang; 200 nodes " << large.training << ", " << large.hang);
  // Its own views, every node's progress (one MULTI_GET: 2 requests with its WAIT), a few
  // nodes' views (2), its verdict (2).
  CHECK(large.training <= 8);
  CHECK(large.training <= small.training + 0.5);
  CHECK(large.hang <= 8);
  CHECK(large.hang <= small.hang + 0.5);
  // The hang named as over every view: the rank that never entered, on its node.
  REQUIRE(large.verdict);
  CHECK_THAT(large.verdict->headline,
             Catch::StartsWith("the job hung at collective " + std::to_string(large.hung_at)) &&
                 Catch::Contains("rank 1203 (host node-150, pid 5203) never entered it"));
  CHECK(large.verdict->blamed == std::vector<int>{1203});
  CHECK(large.verdict->ranks.size() == 8);  // its own ranks' lines
  CHECK(large.shared.at("by") == 0);
  CHECK(large.shared.at("blamed") == nlohmann::json::array({{1203, 1203}}));
  CHECK(large.shared.at("headline") == large.verdict->headline);
}

TEST_CASE("a gatherer that is gone: the next group rank takes over, the others follow it") {
  ddp::test::TestServer server;
  auto quiet = [](const std::string&) {};
  auto node0 = std::make_unique<CollectiveExchange>(quiet, 60s);
  CollectiveExchange node1(quiet, 60s), node2(quiet, 60s), node3(quiet, 60s);
  std::vector<ddp::elastic::RoundInfo> rounds;
  for (int g = 0; g < 4; ++g) rounds.push_back(round_of(g, 4, server.port()));
  ddp::store::ClientOptions options;
  options.port = server.port();
  ddp::store::Client probe(options);
  auto writer = [&] {
    return nlohmann::json::parse(probe.get(CollectiveExchange::verdict_key(0))).at("by").get<int>();
  };
  // Training: node 0 gathers.
  std::uint64_t step = 10;
  auto publish = [&](std::optional<int> blocked) {
    if (node0) node0->publish(rounds[0], node_ranks(0, step, blocked));
    node1.publish(rounds[1], node_ranks(1, step, blocked));
    node2.publish(rounds[2], node_ranks(2, step, blocked));
    node3.publish(rounds[3], node_ranks(3, step, blocked));
  };
  auto deadline = std::chrono::steady_clock::now() + 15s;
  while (!(probe.check({CollectiveExchange::verdict_key(0)}) && writer() == 0) &&
         std::chrono::steady_clock::now() < deadline) {
    ++step;
    publish({});
    std::this_thread::sleep_for(20ms);
  }
  REQUIRE(writer() == 0);
  // Rank 17 (node 2) never enters the next collective; node 0 names it.
  ++step;
  deadline = std::chrono::steady_clock::now() + 15s;
  std::optional<CollectiveDiagnosis> verdict2, verdict3;
  while (!verdict3 && std::chrono::steady_clock::now() < deadline) {
    publish(17);
    verdict3 = node3.judge(node_ranks(3, step, 17), 60);
    std::this_thread::sleep_for(20ms);
  }
  REQUIRE(verdict3);
  // Node 0's agent is gone: node 1 takes over, nodes 2 and 3 follow it.
  node0.reset();
  deadline = std::chrono::steady_clock::now() + kGathererQuiet + 15s;
  while (writer() != 1 && std::chrono::steady_clock::now() < deadline) {
    publish(17);
    std::this_thread::sleep_for(20ms);
  }
  REQUIRE(writer() == 1);
  publish(17);
  verdict2 = node2.judge(node_ranks(2, step, 17), 60);
  verdict3 = node3.judge(node_ranks(3, step, 17), 60);
  REQUIRE(verdict2);
  REQUIRE(verdict3);
  CHECK_THAT(verdict3->headline, Catch::Contains("rank 17 (host node-2, pid 4017) never entered"));
  CHECK(verdict2->blamed == std::vector<int>{17});
  CHECK(node1.remote().size() == 24);  // it read the views of nodes 0 (its last), 2 and 3
  CHECK(node2.remote().empty());       // the others read only its verdict
  CHECK(node3.remote().empty());
  // Node 0's agent is back: node 1 follows it again.
  node0 = std::make_unique<CollectiveExchange>(quiet, 60s);
  deadline = std::chrono::steady_clock::now() + 15s;
  while (!(writer() == 0 && node1.remote().empty()) &&
         std::chrono::steady_clock::now() < deadline) {
    publish(17);
    std::this_thread::sleep_for(20ms);
  }
  CHECK(writer() == 0);
  CHECK(node1.remote().empty());
  REQUIRE(node1.judge(node_ranks(1, step, 17), 60));
}
