// A node's progress in a few bytes: what the gatherer knows a hang by, without the views.
#include "diagnosis/node_progress.hpp"

#include <catch2/catch.hpp>
#include <cmath>
#include <random>

#include "diagnosis/collective_diagnosis.hpp"
#include "diagnosis/rank_view_json.hpp"

using namespace ddp::launcher;

namespace {

// An age to the millisecond (as views travel), often around the timeout.
double age(std::mt19937& random) {
  std::uniform_int_distribution<int> ms(0, 20000);
  return ms(random) / 1000.0;
}

CollectiveInfo collective(std::mt19937& random, std::uint64_t seq, bool finished) {
  CollectiveInfo c;
  c.seq = seq;
  c.op = "all_reduce";
  c.dtype = "float32";
  c.count = 1024;
  c.bytes = 4096;
  c.age_s = age(random);
  c.started = true;
  c.finished = finished;
  return c;
}

// One communicator of one rank, anything judge_hang reads drawn at random.
RankView lane(std::mt19937& random, int rank, int index) {
  std::bernoulli_distribution coin(0.5), rare(0.15);
  RankView v;
  v.rank = rank;
  v.local_rank = rank % 4;
  v.host = "node-" + std::to_string(rank / 4);
  v.pid = 100 + rank;
  v.lane = index;
  v.context = index == 0 ? 0 : static_cast<std::uint64_t>(index + 1);
  v.attached = !rare(random);
  v.running = !rare(random);
  v.backend = "gloo";
  v.finished = 3;
  v.queued = coin(random) ? 4 : 3;
  if (!rare(random)) v.since_finished_s = age(random);
  if (v.queued == 4) v.pending = collective(random, 4, rare(random));
  if (rare(random)) v.p2p = P2pWait{"recv", 16, 0, age(random)};
  return v;
}

// `nodes` nodes of 4 ranks, each with one or two more communicators now and then.
std::vector<std::vector<RankView>> random_job(std::mt19937& random, int nodes) {
  std::bernoulli_distribution coin(0.3);
  std::vector<std::vector<RankView>> job(static_cast<std::size_t>(nodes));
  for (int n = 0; n < nodes; ++n) {
    for (int r = n * 4; r < n * 4 + 4; ++r) {
      RankView v = lane(random, r, 0);
      if (coin(random)) v.lanes.push_back(lane(random, r, 1));
      if (coin(random)) v.lanes.push_back(lane(random, r, 2));
      job[static_cast<std::size_t>(n)].push_back(std::move(v));
    }
  }
  return job;
}

}  // namespace

TEST_CASE("node progress: a hang is possible exactly when judge_hang finds one, over random jobs") {
  std::mt19937 random(20261125);
  int hangs = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    const double timeout = 5.0 + (trial % 7);
    const auto job = random_job(random, 1 + trial % 5);
    // What the gatherer holds: every node's views as they travel (decoded), aged by a
    // different time each, and its progress as decoded from the text it was sent as, aged alike.
    std::vector<RankView> all;
    std::vector<NodeProgress> progress;
    for (const auto& node : job) {
      const double since_read = age(random) / 4;
      std::vector<RankView> views = decode_views(encode_views(node));
      age_views(views, since_read);
      all.insert(all.end(), views.begin(), views.end());
      progress.push_back(decode_progress(encode_progress(progress_of(node))));
      age_progress(progress.back(), since_read);
    }
    const auto verdict = judge_hang(all, timeout);
    const auto hung = hung_communicators(progress, timeout);
    INFO("trial " << trial << ": " << (verdict ? verdict->headline : "no hang"));
    REQUIRE(verdict.has_value() == !hung.empty());
    if (verdict) ++hangs;
  }
  CHECK(hangs > 200);  // both answers were tried often
  CHECK(hangs < 1800);
}

TEST_CASE("node progress: a few bytes whatever the ranks, and read back as written") {
  std::vector<RankView> node;
  for (int r = 0; r < 8; ++r) {
    RankView v;
    v.rank = r;
    v.attached = true;
    v.since_finished_s = 0.0124 + r;
    v.pending = CollectiveInfo{9, "all_reduce", "float32", 1, 4, {}, 300.25 + r, true, false};
    node.push_back(v);
  }
  const NodeProgress progress = progress_of(node);
  REQUIRE(progress.communicators.size() == 1);
  CHECK(*progress.communicators[0].finished_s == Approx(0.012));
  CHECK(*progress.communicators[0].waited_s == Approx(307.25));
  const std::string text = encode_progress(progress);
  CHECK(text == "0:12:307250");
  CHECK(decode_progress(text) == progress);
  CHECK(decode_progress("0:-:-;7:5:-").communicators.size() == 2);
  CHECK_THROWS_AS(decode_progress("0:12"), std::invalid_argument);
  CHECK_THROWS_AS(decode_progress("x:1:2"), std::invalid_argument);
}
