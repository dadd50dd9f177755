// The hang and desync verdicts over made-up rank views: which collective, who waits, who
// never entered, who called it differently; and when it is not a hang.
#include "diagnosis/collective_diagnosis.hpp"

#include <catch2/catch.hpp>
#include <memory>

#include "diagnosis/rank_view_json.hpp"
#include "diagnosis/stack_capture.hpp"

using namespace ddp::launcher;

namespace {

CollectiveInfo all_reduce(std::uint64_t seq, std::uint64_t count, double age_s) {
  CollectiveInfo c;
  c.seq = seq;
  c.op = "all_reduce";
  c.dtype = "float32";
  c.count = count;
  c.bytes = count * 4;
  c.age_s = age_s;
  c.started = true;
  return c;
}

// A rank that finished `finished` collectives, the last one `since` seconds ago, and waits
// in the next one for `waited` seconds (when waited >= 0).
RankView rank(int r, std::uint64_t finished, double since, double waited = -1,
              std::uint64_t count = 1024) {
  RankView v;
  v.rank = r;
  v.local_rank = r;
  v.host = "node-a";
  v.pid = 1000 + r;
  v.attached = true;
  v.finished = finished;
  v.queued = finished;
  if (finished > 0) v.since_finished_s = since;
  if (waited >= 0) {
    v.queued = finished + 1;
    v.pending = all_reduce(finished + 1, count, waited);
  }
  return v;
}

}  // namespace

TEST_CASE("rank_list, byte_text and duration_text read as a person writes them") {
  CHECK(rank_list({3, 0, 1, 2, 6, 8, 9}) == "0-3, 6, 8, 9");
  CHECK(rank_list({0, 1, 3}) == "0, 1, 3");
  CHECK(rank_list({7}) == "7");
  CHECK(byte_text(512) == "512 B");
  CHECK(byte_text(4096) == "4.0 KiB");
  CHECK(byte_text(12u << 20) == "12.0 MiB");
  CHECK(duration_text(300.4) == "300 s");
  CHECK(duration_text(2.54) == "2.5 s");
}

TEST_CASE("a rank that never entered the collective the others wait in is blamed") {
  const std::vector<RankView> views = {rank(0, 1558, 300, 300), rank(1, 1558, 300, 300),
                                       rank(2, 1558, 310)};
  auto hung = judge_hang(views, 60);
  REQUIRE(hung);
  CHECK(hung->collective == 1559u);
  CHECK(hung->blamed == std::vector<int>{2});
  CHECK_FALSE(hung->desync);
  CHECK(hung->headline ==
        "the job hung at collective 1559 (all_reduce, 4.0 KiB float32): ranks 0, 1 have waited "
        "in it for 300 s; rank 2 (host node-a, pid 1002) never entered it: its last finished "
        "collective is 1558, 310 s ago");
  REQUIRE(hung->ranks.size() == 3);
  CHECK(hung->ranks[2] ==
        "rank 2 (host node-a, pid 1002): finished collective 1558 310 s ago; not in a collective");
}

TEST_CASE("no hang while any rank finished a collective within the timeout, or none waits") {
  CHECK_FALSE(judge_hang({rank(0, 10, 5, 5), rank(1, 10, 5)}, 60));    // too recent
  CHECK_FALSE(judge_hang({rank(0, 10, 90, 90), rank(1, 11, 1)}, 60));  // rank 1 moves on
  CHECK_FALSE(judge_hang({rank(0, 10, 90), rank(1, 10, 90)}, 60));     // nobody waits: compute
  RankView unrecorded;  // a worker without libddp tells nothing
  unrecorded.rank = 0;
  CHECK_FALSE(judge_hang({unrecorded}, 60));
}

TEST_CASE("ranks that entered a collective with different counts are a desync, groups named") {
  auto hung = judge_hang(
      {rank(0, 2, 70, 70), rank(1, 2, 70, 70), rank(2, 2, 70, 70), rank(3, 2, 70, 70, 512)}, 60);
  REQUIRE(hung);
  CHECK(hung->desync);
  CHECK(hung->blamed == std::vector<int>{3});
  CHECK(hung->headline ==
        "the job hung at collective 3: its ranks called it differently (a desync): ranks 0-2 "
        "called all_reduce of 1024 float32 (4.0 KiB); rank 3 called all_reduce of 512 float32 "
        "(2.0 KiB)");
}

TEST_CASE("a collective that failed on every rank with different counts is a desync") {
  std::vector<RankView> views;
  for (int r = 0; r < 4; ++r) {
    RankView v = rank(r, 3, 1);
    v.last = all_reduce(3, r == 3 ? 512 : 1024, 1);
    v.last->finished = true;
    v.last->failed = true;
    views.push_back(v);
  }
  const CollectiveDiagnosis d = diagnose(views);
  CHECK(d.collective == 3u);
  CHECK(d.desync);
  CHECK(d.blamed == std::vector<int>{3});
  CHECK(d.headline ==
        "collective 3 failed: its ranks called it differently (a desync): ranks 0-2 called "
        "all_reduce of 1024 float32 (4.0 KiB); rank 3 called all_reduce of 512 float32 (2.0 KiB)");
  CHECK_FALSE(judge_hang(views, 0.5));  // a failure, not a hang
}

TEST_CASE("a rank whose backend failed the collective first and others still in it: a desync") {
  // Rank 1 called collective 3 with 3 elements, its Gloo saw the mismatch and failed it at
  // once; rank 0, which passed 4, still waits in it.
  RankView early = rank(1, 3, 0.1);
  early.last = all_reduce(3, 3, 0.1);
  early.last->finished = true;
  early.last->failed = true;
  early.failed = true;
  early.running = false;
  early.exit_text = "exit code 1";
  const std::vector<RankView> views = {rank(0, 2, 0.1, 0.1, 4), early};
  const CollectiveDiagnosis d = diagnose(views);
  CHECK(d.collective == 3u);
  CHECK(d.desync);
  CHECK_THAT(d.headline, Catch::Contains("rank 0 called all_reduce of 4 float32") &&
                             Catch::Contains("rank 1 called all_reduce of 3 float32"));
}

TEST_CASE("a rank that exited before the collective is named with its exit") {
  RankView gone = rank(1, 2, 80);
  gone.running = false;
  gone.exit_text = "exit code 0";
  auto hung = judge_hang({rank(0, 2, 80, 80), gone}, 60);
  REQUIRE(hung);
  CHECK_THAT(hung->headline, Catch::EndsWith("rank 1 (host node-a, pid 1001) never entered it: "
                                             "its last finished collective is 2, 80 s ago; it "
                                             "exited (exit code 0)"));
}

TEST_CASE("every rank in the collective and none missing: said so") {
  auto hung = judge_hang({rank(0, 4, 100, 100), rank(1, 4, 100, 100)}, 60);
  REQUIRE(hung);
  CHECK(hung->blamed.empty());
  CHECK_THAT(hung->headline, Catch::Contains("every rank entered it (none is missing"));
}

TEST_CASE("a hang at the first collective: a rank that has finished none") {
  auto hung = judge_hang({rank(0, 0, 0, 61), rank(1, 0, 0)}, 60);
  REQUIRE(hung);
  CHECK(hung->collective == 1u);
  CHECK_THAT(hung->headline,
             Catch::EndsWith("never entered it: it has finished no collective yet"));
}

TEST_CASE("a verdict over 1,024 ranks fits in a line: ranks as ranges, the list capped") {
  constexpr int kWorld = 1024;
  constexpr std::size_t kLine = 4096;  // what a console line and an etcd stop reason take
  auto world = [](auto absent) {
    std::vector<RankView> views;
    for (int r = 0; r < kWorld; ++r) {
      views.push_back(absent(r) ? rank(r, 7, 400) : rank(r, 7, 400, 400));
    }
    return views;
  };
  SECTION("one absent rank: the others as two ranges") {
    auto hung = judge_hang(world([](int r) { return r == 512; }), 60);
    REQUIRE(hung);
    CHECK(hung->blamed == std::vector<int>{512});
    CHECK_THAT(hung->headline, Catch::Contains("ranks 0-511, 513-1023 have waited in it") &&
                                   Catch::Contains("rank 512 (host node-a, pid 1512) never "
                                                   "entered it: its last finished collective "
                                                   "is 7, 400 s ago"));
    CHECK(hung->headline.size() < kLine);
  }
  SECTION("every other rank absent: both lists capped, every absent rank still blamed") {
    auto hung = judge_hang(world([](int r) { return r % 2 == 1; }), 60);
    REQUIRE(hung);
    CHECK(hung->blamed.size() == kWorld / 2);
    CHECK_THAT(hung->headline, Catch::Contains("512 ranks never entered it (1, 3, 5,") &&
                                   Catch::Contains("more), among them rank 1 (host node-a"));
    CHECK(hung->headline.size() < kLine);
  }
  SECTION("one rank waits, all others absent") {
    auto hung = judge_hang(world([](int r) { return r != 0; }), 60);
    REQUIRE(hung);
    CHECK(hung->blamed.size() == kWorld - 1);
    CHECK_THAT(hung->headline, Catch::Contains("1023 ranks never entered it (1-1023)"));
    CHECK(hung->headline.size() < kLine);
  }
  SECTION("a desync in which every rank passed its own count") {
    std::vector<RankView> views;
    for (int r = 0; r < kWorld; ++r) views.push_back(rank(r, 7, 400, 400, 1000 + r));
    auto hung = judge_hang(views, 60);
    REQUIRE(hung);
    CHECK(hung->desync);
    CHECK(hung->blamed.size() == kWorld - 1);
    CHECK_THAT(hung->headline, Catch::Contains("other ways"));
    CHECK(hung->headline.size() < kLine);
  }
  SECTION("long host names: the headline is cut, and says so") {
    std::vector<RankView> views = world([](int r) { return r < 3; });
    for (RankView& v : views) v.host = std::string(1500, 'h');
    auto hung = judge_hang(views, 60);
    REQUIRE(hung);
    CHECK(hung->headline.size() < kLine);
    CHECK_THAT(hung->headline, Catch::EndsWith("[... cut]"));
  }
}

TEST_CASE("rank_list names at most 16 runs, then how many ranks more") {
  std::vector<int> even;
  for (int r = 0; r < 1000; r += 2) even.push_back(r);
  CHECK(rank_list(even) ==
        "0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30 and 484 more");
  CHECK(rank_list({0, 1, 2, 4, 5, 6}) == "0-2, 4-6");
}

// Issue 24: a process with a Gloo and an NCCL communicator records both; a hang in the
// second (lane 1) while the first is idle is found and named.
TEST_CASE("a hang in a process's second communicator is found and named") {
  std::vector<RankView> views;
  for (int r = 0; r < 2; ++r) {
    RankView gloo = rank(r, 3, 500);  // idle: its last collective long ago, none pending
    gloo.backend = "gloo";
    gloo.context = 1;
    RankView nccl = rank(r, 40, 90, r == 0 ? 90 : -1);  // rank 1 never entered collective 41
    nccl.backend = "nccl";
    nccl.context = 2;
    nccl.lane = 1;
    gloo.lanes.push_back(nccl);
    views.push_back(gloo);
  }
  CHECK(extra_communicators(views) == std::vector<std::uint64_t>{2});
  CHECK(communicator_views(views, 2).at(1).finished == 40);
  auto hung = judge_hang(views, 60);
  REQUIRE(hung);
  CHECK_THAT(hung->headline,
             Catch::StartsWith("the job hung in communicator 2 (nccl) at collective 41"));
  CHECK(hung->blamed == std::vector<int>{1});
  const auto others = diagnose_lanes(views);
  REQUIRE(others.size() == 1);
  CHECK(others[0].first == "communicator 2 (nccl)");
  // A rank without that lane reads as unrecorded there.
  views[1].lanes.clear();
  CHECK_FALSE(communicator_views(views, 2).at(1).attached);
}

// Issue 28: ranks that use process groups unevenly hold a group in different lanes (rank 0
// made a group of its own first); the views of one group are matched by context, and a
// rank that is no member of a group is not judged in it.
TEST_CASE("a process group is matched across ranks by context, whatever its lane") {
  std::vector<RankView> views;
  for (int r = 0; r < 2; ++r) {
    RankView world = rank(r, 10, 1);
    world.python = true;
    world.context = 1;
    RankView pair = rank(r, 5, 90, r == 0 ? 90 : -1);  // rank 1 never entered collective 6
    pair.python = true;
    pair.context = 3;
    pair.backend = "gloo";
    pair.lane = r == 0 ? 2 : 1;
    if (r == 0) {
      RankView solo = rank(0, 7, 2);  // rank 0's own group: busy, fine
      solo.python = true;
      solo.context = 2;
      solo.lane = 1;
      world.lanes.push_back(solo);
    }
    world.lanes.push_back(pair);
    views.push_back(world);
  }
  CHECK(extra_communicators(views) == std::vector<std::uint64_t>{2, 3});
  const auto pair_views = communicator_views(views, 3);
  CHECK(pair_views.at(0).finished == 5);
  CHECK(pair_views.at(1).finished == 5);
  CHECK_FALSE(communicator_views(views, 2).at(1).attached);  // rank 1 is no member
  auto hung = judge_hang(views, 60);
  REQUIRE(hung);
  CHECK_THAT(hung->headline,
             Catch::StartsWith("the job hung in process group 2 (gloo) at collective 6"));
  CHECK(hung->blamed == std::vector<int>{1});
  CHECK_FALSE(hung->desync);
}

TEST_CASE("an all_to_all with uneven splits is no desync, while other counts are") {
  std::vector<RankView> views = {rank(0, 4, 90, 90, 2), rank(1, 4, 90, 90, 6)};
  for (RankView& v : views) v.pending->op = "all_to_all";
  auto d = judge_hang(views, 60);
  REQUIRE(d);
  CHECK_FALSE(d->desync);
  for (RankView& v : views) v.pending->op = "all_reduce";
  d = judge_hang(views, 60);
  REQUIRE(d);
  CHECK(d->desync);
}

TEST_CASE("a rank that left collectives unrecorded is not judged a desync") {
  std::vector<RankView> views = {rank(0, 4, 90, 90, 2), rank(1, 4, 90, 90, 6)};
  views[0].unrecorded = 1;  // a signal handler's barrier went unnumbered
  auto d = judge_hang(views, 60);
  REQUIRE(d);
  CHECK_FALSE(d->desync);
  CHECK_THAT(d->headline, Catch::Contains("rank 0 left collectives unrecorded"));
  CHECK_THAT(d->ranks.at(0), Catch::Contains("1 collective unrecorded"));
}

TEST_CASE("a rank blocked in a recv is a hang named with its peer, and a dead peer is blamed") {
  std::vector<RankView> views = {rank(0, 4, 90), rank(1, 4, 90)};
  P2pWait wait;
  wait.op = "recv";
  wait.bytes = 16;
  wait.peer = 0;
  wait.age_s = 8;
  views[1].p2p = wait;
  CHECK_FALSE(judge_hang(views, 10));  // not yet
  auto d = judge_hang(views, 3);
  REQUIRE(d);
  CHECK(d->headline ==
        "the job hung at a point-to-point wait: rank 1 (host node-a, pid 1001) has waited in "
        "recv from rank 0 (16 B) for 8.0 s");
  CHECK(d->blamed == std::vector<int>{0});
  CHECK_THAT(d->ranks.at(1), Catch::Contains("[waiting in recv from rank 0 (16 B) for 8.0 s]"));
  // The JSON the agents share keeps the wait.
  const auto decoded = decode_views(encode_views(views, false));
  REQUIRE(decoded.at(1).p2p);
  CHECK(decoded.at(1).p2p->peer == 0u);
  CHECK(decoded.at(1).p2p->op == "recv");
}

TEST_CASE("read_record reads a page's used lanes as the process's other communicators") {
  using namespace ddp::record;
  auto page = std::make_unique<RecordPage>();  // zeroed
  page->version.store(kRecordVersion);
  page->backend.store(pack_name("gloo"));
  page->context.store(1);
  page->lane_state.store(static_cast<std::uint64_t>(LaneState::kOpen));
  for (std::uint32_t lane = 1; lane < kCommunicatorLanes; ++lane) {
    LaneHeader& h = page->lanes[lane - 1].header;
    h.context.store(lane + 1);
    h.backend.store(pack_name("nccl"));
    h.queued.store(5);
    h.finished.store(4);
    CollectiveSlot& slot = page->lanes[lane - 1].collectives[5];
    begin_write(slot);
    slot.seq.store(5);
    slot.op.store(static_cast<std::uint64_t>(Op::kAllReduce));
    slot.queued_ns.store(1);
    end_write(slot);
  }
  page->lanes[0].header.state.store(static_cast<std::uint64_t>(LaneState::kOpen));
  page->lanes[1].header.state.store(static_cast<std::uint64_t>(LaneState::kClosed));
  page->lanes[2].header.state.store(static_cast<std::uint64_t>(LaneState::kClaiming));
  page->magic.store(kRecordMagic);
  RankView view;
  view.rank = 3;
  read_record(*page, 2'000'000'000, view);
  CHECK(view.attached);
  CHECK(view.backend == "gloo");
  CHECK(view.context == 1);
  // Open and closed lanes (a destroyed communicator's last state); not the half-claimed one.
  REQUIRE(view.lanes.size() == 2);
  CHECK(view.lanes[1].lane == 2);
  const RankView& nccl = view.lanes[0];
  CHECK(nccl.rank == 3);
  CHECK(nccl.lane == 1);
  CHECK(communicator_name(nccl) == "communicator 2 (nccl)");
  REQUIRE(nccl.pending);
  CHECK(nccl.pending->seq == 5);
  CHECK(nccl.pending->op == "all_reduce");
}

TEST_CASE("stacks group by their shape, addresses and thread ids aside") {
  const std::string a =
      "PID 11 - process\nTID 11:\n#0  0x00007f00aa nanosleep\n#1  0x0000aa11 main\n";
  const std::string b =
      "PID 12 - process\nTID 12:\n#0  0x00007f00bb nanosleep\n#1  0x0000bb22 main\n";
  const std::string c = "PID 13 - process\nTID 13:\n#0  0x00007f00cc poll\n#1  0x0000cc33 main\n";
  CHECK(stack_shape(a) == stack_shape(b));
  CHECK(stack_shape(a) == "thread:\n  #0 nanosleep\n  #1 main\n");
  const std::string grouped = group_stacks(
      {{0, 11, a, ""}, {1, 12, b, ""}, {2, 13, c, ""}, {3, 14, "", "eu-stack not found"}});
  CHECK(grouped ==
        "2 ranks (0, 1):\n  thread:\n    #0 nanosleep\n    #1 main\n"
        "1 rank (2):\n  thread:\n    #0 poll\n    #1 main\n"
        "rank 3 (pid 14): no stack: eu-stack not found\n");
}

TEST_CASE("views as agents share them: the step history to the millisecond, read back as written") {
  RankView v;
  v.rank = 3;
  v.attached = true;
  v.recent_steps = {{41, 0.2504, 0.0099}, {42, 1.0, 0.0}, {18446744073709551615ull, 12.3456, 7e-4}};
  const auto decoded = decode_views(encode_views({v}, true));
  REQUIRE(decoded.size() == 1);
  const auto& steps = decoded[0].recent_steps;
  REQUIRE(steps.size() == 3);
  CHECK(steps[0].step == 41);
  CHECK(steps[0].compute_s == 0.25);
  CHECK(steps[0].wait_s == 0.01);
  CHECK(steps[1].compute_s == 1.0);
  CHECK(steps[2].step == 18446744073709551615ull);
  CHECK(steps[2].compute_s == 12.346);
  CHECK(steps[2].wait_s == 0.001);
  CHECK(decode_views(encode_views({v}, false))[0].recent_steps.empty());
  CHECK_THROWS_AS(decode_views(R"([{"rank":3,"local_rank":0,"host":"h","pid":1,"running":true,)"
                               R"("attached":true,"backend":"gloo","queued":0,"finished":0,)"
                               R"("recent_steps":"41 x 0.1"}])"),
                  std::invalid_argument);
}
