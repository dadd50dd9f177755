// The store rendezvous engine end to end: several handlers (one per "node") as threads of
// this process against one real store::Server on loopback. Callbacks only push events into
// an inbox; every assertion runs on the test's main thread, waiting for the events it needs
// (never for a fixed time). Timeouts are short (keep_alive 200 ms) but the heartbeat budget
// (2 s) and the waits for outcomes (20 s) leave room for a loaded machine under ASan.

#include <catch2/catch.hpp>

#include "rendezvous_harness.hpp"
#include "store_fixture.hpp"

using namespace std::chrono_literals;
using namespace ddp::elastic;

using namespace ddp::test;

TEST_CASE("store rendezvous: three c10d nodes agree on one round") {
  ddp::test::TestServer server;
  Inbox inbox;
  Job job{"c10d", "job", 3, 3};
  Node a(inbox, settings_for(server.port(), job, "a"));
  Node b(inbox, settings_for(server.port(), job, "b"));
  Node c(inbox, settings_for(server.port(), job, "c"));
  auto rounds = form_round(inbox, {&a, &b, &c}, {"a", "b", "c"});

  const RoundInfo& first = rounds["a"];
  std::vector<int> group_ranks;
  for (const auto& [name, round] : rounds) {
    CHECK(round.round == 0);
    CHECK(round.restart_count == 0);
    CHECK(member_ids(round) == member_ids(first));
    CHECK(round.members[round.group_rank].node_id == name);
    CHECK(round.master_addr == first.master_addr);
    CHECK(round.master_port == first.master_port);
    group_ranks.push_back(round.group_rank);
  }
  std::sort(group_ranks.begin(), group_ranks.end());
  CHECK(group_ranks == std::vector<int>{0, 1, 2});
  // The master is group rank 0 at its own address (found from the store connection) and
  // the worker store port it offered.
  const Member& master = first.members[0];
  CHECK(first.master_addr == "127.0.0.1");
  CHECK(master.addr == "127.0.0.1");
  CHECK(master.host == "host-" + master.node_id);
  CHECK(master.local_world_size == 2);
  int offered = 6000 + (master.node_id == "a" ? 0 : master.node_id == "b" ? 1 : 2);
  CHECK(first.master_port == offered);
  CHECK(a.rdzv().endpoint() == "127.0.0.1:" + std::to_string(server.port()));
}

TEST_CASE("store rendezvous: static ranks follow --node_rank, the master is the store") {
  ddp::test::TestServer server;
  Inbox inbox;
  Job job{"static", "job", 3, 3};
  Node x(inbox, settings_for(server.port(), job, "x", 2));
  Node y(inbox, settings_for(server.port(), job, "y", 0));
  Node z(inbox, settings_for(server.port(), job, "z", 1));
  auto rounds = form_round(inbox, {&x, &y, &z}, {"x", "y", "z"});
  CHECK(rounds["x"].group_rank == 2);
  CHECK(rounds["y"].group_rank == 0);
  CHECK(rounds["z"].group_rank == 1);
  CHECK(member_ids(rounds["x"]) == std::vector<std::string>{"y", "z", "x"});
  CHECK(rounds["x"].master_addr == "127.0.0.1");
  CHECK(rounds["x"].master_port == server.port());
}

TEST_CASE("store rendezvous: static refuses a second node with the same --node_rank") {
  ddp::test::TestServer server;
  Inbox inbox;
  Job job{"static", "job", 2, 2};
  Node x(inbox, settings_for(server.port(), job, "x", 0));
  x.next_round();
  // x is in the open round once its join is visible; y then collides with it.
  Node y(inbox, settings_for(server.port(), job, "y", 0));
  REQUIRE(inbox.take("x", Event::Kind::kWait));
  y.next_round();
  auto error = inbox.take("y", Event::Kind::kError);
  REQUIRE(error);
  CHECK_THAT(error->error, Catch::Contains("--node_rank 0 is already taken by node host-x (x)"));
}

TEST_CASE("store rendezvous: a stopped round reaches every watcher, the next counts a restart") {
  ddp::test::TestServer server;
  Inbox inbox;
  // Round 0 closes at MAX. The last call is far beyond the wait: round 1 must close because
  // every expected node joined.
  Job job{"c10d", "job", 2, 3, 10min};
  Node p(inbox, settings_for(server.port(), job, "p"));
  Node q(inbox, settings_for(server.port(), job, "q"));
  Node r(inbox, settings_for(server.port(), job, "r"));
  form_round(inbox, {&p, &q, &r}, {"p", "q", "r"});
  p.watch();
  q.watch();
  r.watch();

  StopReason failed;
  failed.kind = StopReason::Kind::kWorkerFailed;
  failed.rank = 3;
  failed.local_rank = 1;
  failed.pid = 999;
  failed.exit_code = 7;
  q.rdzv().stop_round(failed);
  for (const char* name : {"p", "q", "r"}) {
    auto stop = inbox.take(name, Event::Kind::kStop);
    REQUIRE(stop);
    CHECK(stop->stop.kind == StopReason::Kind::kWorkerFailed);
    CHECK(stop->stop.node_id == "q");
    CHECK(stop->stop.host == "host-q");
    CHECK(stop->stop.rank == 3);
    CHECK(stop->stop.exit_code == 7);
  }
  auto rounds = form_round(inbox, {&r, &p, &q}, {"p", "q", "r"});
  for (const auto& [name, round] : rounds) {
    CHECK(round.round == 1);
    CHECK(round.restart_count == 1);
    CHECK(round.members.size() == 3);
  }
  CHECK(inbox.count(Event::Kind::kStop) == 0);  // one stop per node and round
}

TEST_CASE("store rendezvous: a silent node is found lost, the others go on without it") {
  ddp::test::TestServer server;
  Inbox inbox;
  Job job{"c10d", "job", 2, 3, 10min};
  Node a(inbox, settings_for(server.port(), job, "a"));
  Node b(inbox, settings_for(server.port(), job, "b"));
  Node c(inbox, settings_for(server.port(), job, "c"));
  form_round(inbox, {&a, &b, &c}, {"a", "b", "c"});
  a.watch();
  b.watch();
  c.watch();
  c.crash();  // no leave(): its heartbeat just stops

  for (const char* name : {"a", "b"}) {
    auto stop = inbox.take(name, Event::Kind::kStop);
    REQUIRE(stop);
    CHECK(stop->stop.kind == StopReason::Kind::kNodeLost);
    CHECK(stop->stop.node_id == "c");
    CHECK(stop->stop.host == "host-c");
    CHECK_THAT(stop->stop.message, Catch::Contains("no heartbeat for 2 s"));
  }
  // Both survivors were expected: round 1 closes at once, well before the 10 min last call.
  auto rounds = form_round(inbox, {&a, &b}, {"a", "b"});
  CHECK(member_ids(rounds["a"]).size() == 2);
  CHECK(rounds["a"].round == 1);
  CHECK(rounds["a"].restart_count == 0);  // a lost node is not a worker failure
}

TEST_CASE("store rendezvous: a late node makes the running round restart into a larger one") {
  ddp::test::TestServer server;
  Inbox inbox;
  Job job{"c10d", "job", 2, 3};  // round 0 closes at MIN after a 300 ms last call
  Node a(inbox, settings_for(server.port(), job, "a"));
  Node b(inbox, settings_for(server.port(), job, "b"));
  auto first = form_round(inbox, {&a, &b}, {"a", "b"});
  CHECK(first["a"].members.size() == 2);
  a.watch();
  b.watch();

  Node c(inbox, settings_for(server.port(), job, "c"));
  c.next_round(7000);
  for (const char* name : {"a", "b"}) {
    auto stop = inbox.take(name, Event::Kind::kStop);
    REQUIRE(stop);
    CHECK(stop->stop.kind == StopReason::Kind::kNodeJoined);
    CHECK(stop->stop.node_id == "c");
  }
  a.next_round(6000);
  b.next_round(6001);
  for (const char* name : {"a", "b", "c"}) {
    auto round = inbox.take(name, Event::Kind::kRound);
    REQUIRE(round);
    CHECK(round->round.round == 1);
    CHECK(round->round.restart_count == 0);  // a membership change is not a restart
    CHECK(member_ids(round->round).size() == 3);
    CHECK(member_ids(round->round).back() == "c");  // the survivors keep their ranks first
  }
}

TEST_CASE("store rendezvous: the exit barrier, then late nodes are told the job finished") {
  ddp::test::TestServer server;
  Inbox inbox;
  Job job{"c10d", "job", 2, 2};
  Node a(inbox, settings_for(server.port(), job, "a"));
  Node b(inbox, settings_for(server.port(), job, "b"));
  form_round(inbox, {&a, &b}, {"a", "b"});
  a.watch();
  b.watch();
  a.finish();
  b.finish();
  for (const char* name : {"a", "b"}) {
    auto done = inbox.take(name, Event::Kind::kDone);
    REQUIRE(done);
    CHECK(done->done);
  }
  CHECK(inbox.count(Event::Kind::kStop) == 0);  // a finished round is no stop

  Node late(inbox, settings_for(server.port(), job, "late"));
  late.next_round();
  auto error = inbox.take("late", Event::Kind::kError);
  REQUIRE(error);
  CHECK(error->closed_error);
  CHECK_THAT(error->error,
             Catch::Contains("rendezvous 'job' at 127.0.0.1:" + std::to_string(server.port()) +
                             " is closed: the job finished"));
}

TEST_CASE("store rendezvous: a stop during the exit barrier fails it") {
  ddp::test::TestServer server;
  Inbox inbox;
  Job job{"c10d", "job", 2, 2};
  Node a(inbox, settings_for(server.port(), job, "a"));
  Node b(inbox, settings_for(server.port(), job, "b"));
  form_round(inbox, {&a, &b}, {"a", "b"});
  a.watch();
  b.watch();
  a.finish();
  StopReason failed;
  failed.rank = 2;
  b.rdzv().stop_round(failed);
  auto done = inbox.take("a", Event::Kind::kDone);
  REQUIRE(done);
  CHECK_FALSE(done->done);
  for (const char* name : {"a", "b"}) {
    auto stop = inbox.take(name, Event::Kind::kStop);
    REQUIRE(stop);
    CHECK(stop->stop.node_id == "b");
  }
}

TEST_CASE("store rendezvous: a node that leaves ends the round, the others go on") {
  ddp::test::TestServer server;
  Inbox inbox;
  Job job{"c10d", "job", 2, 3, 10min};
  Node a(inbox, settings_for(server.port(), job, "a"));
  Node b(inbox, settings_for(server.port(), job, "b"));
  Node c(inbox, settings_for(server.port(), job, "c"));
  form_round(inbox, {&a, &b, &c}, {"a", "b", "c"});
  a.watch();
  b.watch();
  c.watch();
  c.rdzv().leave();
  for (const char* name : {"a", "b"}) {
    auto stop = inbox.take(name, Event::Kind::kStop);
    REQUIRE(stop);
    CHECK(stop->stop.kind == StopReason::Kind::kNodeLeft);
    CHECK(stop->stop.node_id == "c");
  }
  auto rounds = form_round(inbox, {&a, &b}, {"a", "b"});
  CHECK(member_ids(rounds["b"]).size() == 2);
  CHECK(inbox.count(Event::Kind::kStop) == 0);  // nothing reaches c after leave()
}

TEST_CASE("store rendezvous: waiting is reported, a join timeout names the endpoint and MIN") {
  ddp::test::TestServer server;
  Inbox inbox;
  Job job{"c10d", "job", 2, 3};
  job.join = 1s;
  Node a(inbox, settings_for(server.port(), job, "a"));
  a.next_round();
  auto wait = inbox.take("a", Event::Kind::kWait);
  REQUIRE(wait);
  CHECK(wait->wait.joined == 1);
  CHECK(wait->wait.min_nodes == 2);
  CHECK(wait->wait.max_nodes == 3);
  CHECK(wait->wait.endpoint == "127.0.0.1:" + std::to_string(server.port()));
  CHECK_FALSE(wait->wait.wait_listed);
  auto error = inbox.take("a", Event::Kind::kError);
  REQUIRE(error);
  CHECK_FALSE(error->closed_error);
  CHECK_THAT(error->error, Catch::Contains("rendezvous 'job' at 127.0.0.1:" +
                                           std::to_string(server.port()) + " timed out after 1 s"));
  CHECK_THAT(error->error, Catch::Contains("1 of the 2 nodes needed joined (--nnodes=2:3)"));
}

TEST_CASE("store rendezvous: an unreachable store is reported with its address") {
  int port = 0;
  {
    ddp::test::TestServer closed;  // a port that nothing listens on once it is gone
    port = closed.port();
  }
  Inbox inbox;
  Job job{"c10d", "job", 1, 1};
  job.join = 1s;
  Node a(inbox, settings_for(port, job, "a"));
  a.next_round();
  auto error = inbox.take("a", Event::Kind::kError);
  REQUIRE(error);
  CHECK_THAT(error->error, Catch::Contains("could not reach the rendezvous store at 127.0.0.1:" +
                                           std::to_string(port)));
  CHECK_THAT(error->error, Catch::Contains("is the agent of node 0"));
}

TEST_CASE("store rendezvous: two run ids on one store never mix") {
  ddp::test::TestServer server;
  Inbox inbox;
  Job one{"c10d", "one", 2, 2};
  Job two{"c10d", "two", 2, 2};
  Node a(inbox, settings_for(server.port(), one, "a"));
  Node b(inbox, settings_for(server.port(), two, "b"));
  Node c(inbox, settings_for(server.port(), one, "c"));
  Node d(inbox, settings_for(server.port(), two, "d"));
  auto rounds = form_round(inbox, {&a, &b, &c, &d}, {"a", "b", "c", "d"});
  auto sorted = [](std::vector<std::string> ids) {
    std::sort(ids.begin(), ids.end());
    return ids;
  };
  CHECK(sorted(member_ids(rounds["a"])) == std::vector<std::string>{"a", "c"});
  CHECK(sorted(member_ids(rounds["b"])) == std::vector<std::string>{"b", "d"});
}

TEST_CASE("store rendezvous: losing the store while a round runs stops it") {
  auto server = std::make_unique<ddp::test::TestServer>();
  Inbox inbox;
  Job job{"c10d", "job", 1, 1};
  int port = server->port();
  Node a(inbox, settings_for(port, job, "a"));
  form_round(inbox, {&a}, {"a"});
  a.watch();
  server.reset();
  auto stop = inbox.take("a", Event::Kind::kStop);
  REQUIRE(stop);
  CHECK(stop->stop.kind == StopReason::Kind::kNodeLost);
  CHECK(stop->stop.node_id.empty());
  CHECK_THAT(describe(stop->stop), Catch::StartsWith("the rendezvous store was lost: "));
  CHECK_THAT(stop->stop.message, Catch::Contains("127.0.0.1:" + std::to_string(port)));
}

TEST_CASE(
    "store rendezvous: a store host too busy to answer the watcher's first connection within "
    "the heartbeat budget does not stop the round (issue 49)") {
  ddp::test::TestServer server;
  Inbox inbox;
  Job job{"c10d", "job", 1, 1};
  Node a(inbox, settings_for(server.port(), job, "a"));  // a 2 s heartbeat budget
  form_round(inbox, {&a}, {"a"});
  {
    auto busy = server.hold();  // every node connects its watcher as the round starts
    a.watch();
    // Before issue 49 the watcher gave up after the budget: "could not reach the store".
    if (auto stop = inbox.take("a", Event::Kind::kStop, 3500ms)) {
      FAIL_CHECK("the round stopped: " << describe(stop->stop));
    }
  }
  // Once the host answers, the watcher is connected and sees the round's end.
  StopReason left;
  left.kind = StopReason::Kind::kNodeLeft;
  a.rdzv().stop_round(left);
  auto stop = inbox.take("a", Event::Kind::kStop);
  REQUIRE(stop);
  CHECK(stop->stop.kind == StopReason::Kind::kNodeLeft);
}

TEST_CASE("store rendezvous: a node that dies while waiting is dropped from the open round") {
  ddp::test::TestServer server;
  Inbox inbox;
  Job job{"c10d", "job", 3, 4, 10min};  // at MIN the round waits for a 10 min last call
  Node a(inbox, settings_for(server.port(), job, "a"));
  Node b(inbox, settings_for(server.port(), job, "b"));
  Node c(inbox, settings_for(server.port(), job, "c"));
  a.next_round();
  b.next_round();
  c.next_round();
  auto joined = [&](int n) {
    for (auto deadline = std::chrono::steady_clock::now() + kOutcome;
         std::chrono::steady_clock::now() < deadline;) {
      auto wait = inbox.take("a", Event::Kind::kWait);
      if (wait && wait->wait.joined == n) return true;
    }
    return false;
  };
  REQUIRE(joined(3));
  c.crash();
  REQUIRE(joined(2));  // c's heartbeat went stale: removed, the round is below MIN again
  Node d(inbox, settings_for(server.port(), job, "d"));
  Node e(inbox, settings_for(server.port(), job, "e"));
  d.next_round();
  e.next_round();  // a, b, d, e: MAX
  for (const char* name : {"a", "b", "d", "e"}) {
    auto round = inbox.take(name, Event::Kind::kRound);
    REQUIRE(round);
    CHECK(round->round.members.size() == 4);
  }
}

TEST_CASE("store rendezvous: eight nodes go through several failures and restarts together") {
  ddp::test::TestServer server;
  Inbox inbox;
  Job job{"c10d", "job", 4, 8, 10min};
  std::vector<std::unique_ptr<Node>> nodes;
  std::vector<Node*> all;
  std::vector<std::string> names;
  for (int i = 0; i < 8; ++i) {
    names.push_back("n" + std::to_string(i));
    nodes.push_back(std::make_unique<Node>(inbox, settings_for(server.port(), job, names.back())));
    all.push_back(nodes.back().get());
  }
  for (int attempt = 0; attempt < 3; ++attempt) {
    auto rounds = form_round(inbox, all, names);
    for (const auto& [name, round] : rounds) {
      CHECK(round.round == attempt);
      CHECK(round.restart_count == attempt);
      CHECK(member_ids(round) == member_ids(rounds["n0"]));
    }
    for (auto* node : all) node->watch();
    StopReason failed;
    failed.rank = attempt;
    all[attempt * 3 % 8]->rdzv().stop_round(failed);
    for (const auto& name : names) {
      auto stop = inbox.take(name, Event::Kind::kStop);
      REQUIRE(stop);
      CHECK(stop->stop.rank == attempt);
    }
  }
}

TEST_CASE("store rendezvous: a node arriving while the job finishes does not restart it") {
  ddp::test::TestServer server;
  Inbox inbox;
  Job job{"c10d", "job", 2, 3};
  Node a(inbox, settings_for(server.port(), job, "a"));
  Node b(inbox, settings_for(server.port(), job, "b"));
  form_round(inbox, {&a, &b}, {"a", "b"});
  a.watch();
  b.watch();
  a.finish();  // a's workers succeeded; b's still run
  // a is in the barrier once its key is in: look through a client of our own.
  ddp::store::Client probe(server.client_options());
  REQUIRE(ddp::test::eventually([&] { return probe.check({"/ddprun/job/round_0/done/a"}); }));
  Node late(inbox, settings_for(server.port(), job, "late"));
  late.next_round();
  REQUIRE(inbox.take("late", Event::Kind::kWait));  // it is waiting, not stopping the round
  b.finish();
  for (const char* name : {"a", "b"}) {
    auto done = inbox.take(name, Event::Kind::kDone);
    REQUIRE(done);
    CHECK(done->done);
  }
  auto error = inbox.take("late", Event::Kind::kError);
  REQUIRE(error);
  CHECK(error->closed_error);
  CHECK(inbox.count(Event::Kind::kStop) == 0);
}
