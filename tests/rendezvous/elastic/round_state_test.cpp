// The rendezvous round logic, without store, thread or clock: every transition of
// round_state.hpp on hand-made states.

#include "ddp/elastic/round_state.hpp"

#include <catch2/catch.hpp>

using namespace std::chrono_literals;
using namespace ddp::elastic;

namespace {

Participant node(const std::string& id, std::optional<int> fixed_rank = std::nullopt) {
  Participant p;
  p.node_id = id;
  p.host = "host-" + id;
  p.addr = "10.0.0." + id;
  p.local_world_size = 2;
  p.fixed_group_rank = fixed_rank;
  p.worker_store_port = 4000 + static_cast<int>(id.size());
  return p;
}

RoundRules c10d(int min_nodes, int max_nodes) {
  RoundRules rules;
  rules.min_nodes = min_nodes;
  rules.max_nodes = max_nodes;
  rules.last_call = 30s;
  return rules;
}

RoundRules static_rules(int nodes) {
  RoundRules rules = c10d(nodes, nodes);
  rules.is_static = true;
  rules.static_master_addr = "store-host";
  rules.static_master_port = 29500;
  return rules;
}

JoinInput fresh(const Participant& self) { return JoinInput{self, std::nullopt, std::nullopt}; }

// Joins each node in turn, applying every state change; returns the final state.
RoundState join_all(std::optional<RoundState> state, const std::vector<Participant>& nodes,
                    const RoundRules& rules) {
  for (const auto& n : nodes) {
    auto result = join_round(state, fresh(n), rules);
    REQUIRE(result.kind == JoinResult::Kind::kJoined);
    REQUIRE(result.next);
    state = result.next;
  }
  return *state;
}

std::vector<std::string> ids(const std::vector<Participant>& nodes) {
  std::vector<std::string> out;
  for (const auto& n : nodes) out.push_back(n.node_id);
  return out;
}

RoundEnd ended(StopReason::Kind kind) { return RoundEnd{false, make_stop(kind, "x", "hx")}; }

// A running round r with members a, b, c (in that rank order), as after close.
RoundState running(int round, std::vector<Participant> members, int restart_count = 0) {
  RoundState state;
  state.round = round;
  state.phase = Phase::kRunning;
  state.restart_count = restart_count;
  state.participants = std::move(members);
  return state;
}

}  // namespace

TEST_CASE("round state: the first node opens round 0, joining twice changes nothing") {
  auto rules = c10d(2, 3);
  auto first = join_round(std::nullopt, fresh(node("a")), rules);
  CHECK(first.kind == JoinResult::Kind::kJoined);
  REQUIRE(first.next);
  CHECK(first.next->round == 0);
  CHECK(first.next->phase == Phase::kOpen);
  CHECK(ids(first.next->participants) == std::vector<std::string>{"a"});

  auto again = join_round(first.next, fresh(node("a")), rules);
  CHECK(again.kind == JoinResult::Kind::kJoined);
  CHECK_FALSE(again.next);
}

TEST_CASE("round state: MAX closes at once, ranks by join order, master is rank 0") {
  auto state = join_all(std::nullopt, {node("c"), node("a"), node("bb")}, c10d(2, 3));
  CHECK(state.phase == Phase::kRunning);
  CHECK(ids(state.participants) == std::vector<std::string>{"c", "a", "bb"});
  CHECK(state.master_addr == "10.0.0.c");
  CHECK(state.master_port == 4001);
  CHECK(state.expected.empty());
}

TEST_CASE("round state: at MIN the round closes only after the last call") {
  auto rules = c10d(2, 4);
  auto state = join_all(std::nullopt, {node("a"), node("b")}, rules);
  CHECK(state.phase == Phase::kOpen);
  CHECK_FALSE(close_due(state, rules, std::nullopt));
  CHECK_FALSE(close_due(state, rules, 29s));
  CHECK(close_due(state, rules, 30s));

  auto one = join_all(std::nullopt, {node("a")}, rules);
  CHECK_FALSE(close_due(one, rules, 1h));  // below MIN: never

  auto closed = close_round(state, rules);
  CHECK(closed.phase == Phase::kRunning);
  CHECK(ids(closed.participants) == std::vector<std::string>{"a", "b"});
  CHECK_FALSE(close_due(closed, rules, 1h));  // already closed
}

TEST_CASE("round state: the last-call timer runs on the observer's clock from MIN") {
  auto rules = c10d(2, 4);
  LastCallTimer timer;
  auto t0 = LastCallTimer::Clock::time_point{} + 1h;
  auto one = join_all(std::nullopt, {node("a")}, rules);
  CHECK_FALSE(timer.observe(one, rules, t0));
  auto two = join_all(one, {node("b")}, rules);
  CHECK(timer.observe(two, rules, t0 + 5s) == 0s);
  CHECK(timer.observe(two, rules, t0 + 12s) == 7s);
  CHECK_FALSE(timer.observe(one, rules, t0 + 13s));  // fell below MIN: starts again
  CHECK(timer.observe(two, rules, t0 + 20s) == 0s);
  RoundState next_round = two;
  next_round.round = 1;
  CHECK(timer.observe(next_round, rules, t0 + 25s) == 0s);  // another round: starts again
}

TEST_CASE("round state: a re-round closes as soon as every expected node joined") {
  auto rules = c10d(2, 4);
  auto state = running(3, {node("a"), node("b"), node("c")}, 1);
  // c asks first after a worker failure: it opens round 4.
  JoinInput input{node("c"), 3, ended(StopReason::Kind::kWorkerFailed)};
  auto opened = join_round(state, input, rules);
  CHECK(opened.kind == JoinResult::Kind::kJoined);
  REQUIRE(opened.next);
  CHECK(opened.next->round == 4);
  CHECK(opened.next->phase == Phase::kOpen);
  CHECK(opened.next->restart_count == 2);
  CHECK(opened.next->expected == std::vector<std::string>{"a", "b", "c"});

  // b then a (joining the open round as any node does): closes with a, b, c in old order.
  auto with_b = join_round(opened.next, JoinInput{node("b"), 3, std::nullopt}, rules);
  REQUIRE(with_b.next);
  CHECK(with_b.next->phase == Phase::kOpen);
  CHECK_FALSE(close_due(*with_b.next, rules, std::nullopt));
  auto with_a = join_round(with_b.next, JoinInput{node("a"), 3, std::nullopt}, rules);
  REQUIRE(with_a.next);
  CHECK(with_a.next->phase == Phase::kRunning);
  CHECK(ids(with_a.next->participants) == std::vector<std::string>{"a", "b", "c"});
  CHECK(with_a.next->restart_count == 2);
}

TEST_CASE("round state: only a worker failure counts as a restart") {
  CHECK(next_restart_count(2, ended(StopReason::Kind::kWorkerFailed)) == 3);
  CHECK(next_restart_count(2, ended(StopReason::Kind::kNodeLost)) == 2);
  CHECK(next_restart_count(2, ended(StopReason::Kind::kNodeJoined)) == 2);
  CHECK(next_restart_count(2, ended(StopReason::Kind::kNodeLeft)) == 2);
  CHECK(next_restart_count(2, RoundEnd{true, {}}) == 2);

  auto rules = c10d(1, 4);
  auto state = running(0, {node("a")});
  auto lost = join_round(state, JoinInput{node("a"), 0, ended(StopReason::Kind::kNodeLost)}, rules);
  REQUIRE(lost.next);
  CHECK(lost.next->restart_count == 0);
  // A member that asks again without any recorded end: a membership change.
  auto unrecorded = join_round(state, JoinInput{node("a"), 0, std::nullopt}, rules);
  REQUIRE(unrecorded.next);
  CHECK(unrecorded.next->round == 1);
  CHECK(unrecorded.next->restart_count == 0);
}

TEST_CASE("round state: a node arriving while a round runs waits, and ends it if it has room") {
  auto rules = c10d(1, 3);
  auto state = running(0, {node("a"), node("b")});
  auto late = join_round(state, fresh(node("d")), rules);
  CHECK(late.kind == JoinResult::Kind::kWaitListed);
  CHECK(late.request_stop);
  REQUIRE(late.next);
  CHECK(ids(late.next->wait_list) == std::vector<std::string>{"d"});
  CHECK(late.next->phase == Phase::kRunning);

  auto again = join_round(late.next, fresh(node("d")), rules);
  CHECK(again.kind == JoinResult::Kind::kWaitListed);
  CHECK_FALSE(again.next);

  // The members restart into a larger world: d is moved in and expected.
  auto opened =
      join_round(late.next, JoinInput{node("b"), 0, ended(StopReason::Kind::kNodeJoined)}, rules);
  REQUIRE(opened.next);
  CHECK(opened.next->restart_count == 0);
  CHECK(opened.next->wait_list.empty());
  CHECK(opened.next->expected == std::vector<std::string>{"a", "b", "d"});
  CHECK(ids(opened.next->participants) == std::vector<std::string>{"d", "b"});
  auto closed = join_round(opened.next, JoinInput{node("a"), 0, std::nullopt}, rules);
  REQUIRE(closed.next);
  CHECK(closed.next->phase == Phase::kRunning);
  CHECK(ids(closed.next->participants) == std::vector<std::string>{"a", "b", "d"});
}

TEST_CASE("round state: a full round keeps late nodes waiting without ending it") {
  auto rules = c10d(1, 2);
  auto state = running(0, {node("a"), node("b")});
  auto late = join_round(state, fresh(node("d")), rules);
  CHECK(late.kind == JoinResult::Kind::kWaitListed);
  CHECK_FALSE(late.request_stop);
  auto later = join_round(late.next, fresh(node("e")), rules);
  REQUIRE(later.next);
  CHECK(ids(later.next->wait_list) == std::vector<std::string>{"d", "e"});

  // b is lost; a opens the next round: room for one waiting node, the other keeps waiting.
  auto without_b = remove_node(*later.next, "b");
  REQUIRE(without_b);
  auto opened =
      join_round(without_b, JoinInput{node("a"), 0, ended(StopReason::Kind::kNodeLost)}, rules);
  REQUIRE(opened.next);
  CHECK(opened.next->phase == Phase::kRunning);  // a + d = MAX
  CHECK(ids(opened.next->participants) == std::vector<std::string>{"a", "d"});
  CHECK(ids(opened.next->wait_list) == std::vector<std::string>{"e"});
}

TEST_CASE("round state: a node finding the open round full waits for the next one") {
  auto rules = c10d(2, 2);
  RoundState open;
  open.round = 2;
  open.participants = {node("a"), node("b")};  // as if a closer had not acted yet
  auto result = join_round(open, fresh(node("c")), rules);
  CHECK(result.kind == JoinResult::Kind::kWaitListed);
  CHECK_FALSE(result.request_stop);
  REQUIRE(result.next);
  CHECK(ids(result.next->wait_list) == std::vector<std::string>{"c"});
}

TEST_CASE("round state: a waiting node moved into a round that closed finds itself in it") {
  auto rules = c10d(1, 3);
  auto state = running(5, {node("a"), node("d")});
  auto result = join_round(state, JoinInput{node("d"), 2, std::nullopt}, rules);
  CHECK(result.kind == JoinResult::Kind::kInRound);
  CHECK_FALSE(result.next);
  auto info = round_info(state, "d");
  REQUIRE(info);
  CHECK(info->round == 5);
  CHECK(info->group_rank == 1);
}

TEST_CASE("round state: removing dead or departed nodes") {
  auto rules = c10d(2, 4);
  RoundState open;
  open.round = 1;
  open.expected = {"a", "b", "c"};
  open.participants = {node("a"), node("b")};
  open.wait_list = {node("w")};
  CHECK_FALSE(close_due(open, rules, std::nullopt));  // c is expected

  auto without_c = remove_node(open, "c");  // c died before joining
  REQUIRE(without_c);
  CHECK(without_c->expected == std::vector<std::string>{"a", "b"});
  CHECK(close_due(*without_c, rules, std::nullopt));  // all expected are in

  auto without_w = remove_node(open, "w");
  REQUIRE(without_w);
  CHECK(without_w->wait_list.empty());

  auto without_a = remove_node(open, "a");
  REQUIRE(without_a);
  CHECK(ids(without_a->participants) == std::vector<std::string>{"b"});
  CHECK(without_a->expected == std::vector<std::string>{"b", "c"});
  CHECK_FALSE(close_due(*without_a, rules, 1h));  // below MIN

  CHECK_FALSE(remove_node(open, "nobody"));
}

TEST_CASE("round state: nodes to watch are the joined, waiting and expected ones") {
  RoundState open;
  open.expected = {"a", "c"};
  open.participants = {node("a"), node("b")};
  open.wait_list = {node("w")};
  CHECK(nodes_to_watch(open) == std::vector<std::string>{"a", "b", "w", "c"});
}

TEST_CASE("round state: static ranks are the node ranks, the master is the store") {
  auto rules = static_rules(3);
  auto state = join_all(std::nullopt, {node("x", 2), node("y", 0), node("z", 1)}, rules);
  CHECK(state.phase == Phase::kRunning);
  CHECK(ids(state.participants) == std::vector<std::string>{"y", "z", "x"});
  CHECK(state.master_addr == "store-host");
  CHECK(state.master_port == 29500);
  auto info = round_info(state, "x");
  REQUIRE(info);
  CHECK(info->group_rank == 2);
}

TEST_CASE("round state: static refuses a taken or out-of-range node rank") {
  auto rules = static_rules(3);
  auto state = join_all(std::nullopt, {node("x", 1)}, rules);
  auto taken = join_round(state, fresh(node("y", 1)), rules);
  CHECK(taken.kind == JoinResult::Kind::kRejected);
  CHECK_FALSE(taken.next);
  CHECK_THAT(taken.error, Catch::Contains("--node_rank 1 is already taken by node host-x (x)"));

  auto high = join_round(state, fresh(node("y", 3)), rules);
  CHECK(high.kind == JoinResult::Kind::kRejected);
  CHECK_THAT(high.error, Catch::Contains("--node_rank 3 is outside 0..2"));

  auto none = join_round(state, fresh(node("y")), rules);
  CHECK(none.kind == JoinResult::Kind::kRejected);
}

TEST_CASE("round state: the exit barrier finishes the job and closes the rendezvous") {
  auto rules = c10d(1, 3);
  auto state = running(2, {node("a"), node("b")});
  CHECK_FALSE(finish(state, 1));
  auto done = finish(state, 2);
  REQUIRE(done);
  CHECK(done->phase == Phase::kFinished);
  CHECK_FALSE(finish(*done, 2));

  CHECK(join_round(done, fresh(node("late")), rules).kind == JoinResult::Kind::kFinished);
  CHECK(join_round(done, JoinInput{node("a"), 2, RoundEnd{true, {}}}, rules).kind ==
        JoinResult::Kind::kFinished);
  // A member whose round ended finished, before the state says so: also closed.
  CHECK(join_round(state, JoinInput{node("a"), 2, RoundEnd{true, {}}}, rules).kind ==
        JoinResult::Kind::kFinished);
}

TEST_CASE("round state: round info gives group ranks and the members by rank") {
  auto state = running(1, {node("a"), node("b")}, 4);
  state.master_addr = "10.0.0.a";
  state.master_port = 1234;
  auto info = round_info(state, "b");
  REQUIRE(info);
  CHECK(info->round == 1);
  CHECK(info->restart_count == 4);
  CHECK(info->group_rank == 1);
  REQUIRE(info->members.size() == 2);
  CHECK(info->members[0].node_id == "a");
  CHECK(info->members[0].addr == "10.0.0.a");
  CHECK(info->members[1].local_world_size == 2);
  CHECK(info->master_addr == "10.0.0.a");
  CHECK(info->master_port == 1234);
  CHECK_FALSE(round_info(state, "zz"));
  RoundState open;
  open.participants = {node("a")};
  CHECK_FALSE(round_info(open, "a"));
}

TEST_CASE("round state: JSON round trip of states and ends") {
  RoundState state = running(7, {node("a", 0), node("b")}, 3);
  state.wait_list = {node("w")};
  state.master_addr = "10.0.0.a";
  state.master_port = 29400;
  auto back = decode_state(encode_state(state));
  CHECK(encode_state(back) == encode_state(state));
  CHECK(back.participants[0].fixed_group_rank == 0);
  CHECK_FALSE(back.participants[1].fixed_group_rank);

  StopReason failed = make_stop(StopReason::Kind::kWorkerFailed, "n1", "h1", "boom");
  failed.rank = 3;
  failed.local_rank = 1;
  failed.pid = 42;
  failed.exit_code = 7;
  failed.error_file = "/tmp/e.json";
  auto end = decode_end(encode_end(RoundEnd{false, failed}));
  CHECK_FALSE(end.finished);
  CHECK(end.reason.kind == StopReason::Kind::kWorkerFailed);
  CHECK(end.reason.rank == 3);
  CHECK(end.reason.exit_code == 7);
  CHECK(end.reason.message == "boom");
  CHECK(end.reason.error_file == "/tmp/e.json");
  CHECK(decode_end(encode_end(RoundEnd{true, {}})).finished);
  // A hang is a stop reason of its own, counted as a failure (next_restart_count).
  StopReason hung = failed;
  hung.kind = StopReason::Kind::kHung;
  const RoundEnd hung_end = decode_end(encode_end(RoundEnd{false, hung}));
  CHECK(hung_end.reason.kind == StopReason::Kind::kHung);
  CHECK(hung_end.reason.failed());
  CHECK(next_restart_count(2, hung_end) == 3);

  CHECK_THROWS_AS(decode_state("not json"), RendezvousError);
  CHECK_THROWS_AS(decode_state("{\"round\": 1}"), RendezvousError);
  CHECK_THROWS_AS(decode_end("{\"kind\": \"bogus\"}"), RendezvousError);
}

TEST_CASE(
    "round state: the node that opens a round tends it, and a member takes over a removed tender") {
  auto rules = c10d(2, 4);
  auto state = join_all(std::nullopt, {node("a"), node("b")}, rules);
  CHECK(state.tender == "a");  // the opener; a later joiner does not change it

  auto without = remove_node(state, "a");
  REQUIRE(without);
  CHECK(without->tender.empty());
  auto again = join_round(without, fresh(node("b")), rules);  // b is a member already
  CHECK(again.kind == JoinResult::Kind::kJoined);
  REQUIRE(again.next);
  CHECK(again.next->tender == "b");

  // The member of a finished round that opens the next one tends it.
  auto next = join_round(running(3, {node("a"), node("b")}),
                         JoinInput{node("b"), 3, ended(StopReason::Kind::kNodeLost)}, rules);
  REQUIRE(next.next);
  CHECK(next.next->round == 4);
  CHECK(next.next->tender == "b");
}

TEST_CASE("round state: the tender folds queued joiners in order, closing at MAX") {
  auto rules = c10d(2, 3);
  auto state = join_all(std::nullopt, {node("a")}, rules);
  auto folded = fold_queued(state, {node("b"), node("a"), node("c"), node("d")}, rules);
  // b joins, a is in already, c makes MAX and closes the round; d waits for the next one.
  CHECK(folded.state.phase == Phase::kRunning);
  CHECK(ids(folded.state.participants) == std::vector<std::string>{"a", "b", "c"});
  CHECK(folded.state.queued == 3);
  CHECK(folded.rejected.empty());

  auto open = fold_queued(join_all(std::nullopt, {node("a")}, c10d(2, 5)), {node("b")}, rules);
  CHECK(open.state.phase == Phase::kOpen);
  CHECK(open.state.queued == 1);
  auto more = fold_queued(open.state, {node("c")}, c10d(2, 5));
  CHECK(more.state.queued == 2);
  CHECK(ids(more.state.participants) == std::vector<std::string>{"a", "b", "c"});
}

TEST_CASE(
    "round state: static, the tender leaves out a queued node whose rank is taken, with why") {
  auto rules = static_rules(3);
  auto state = join_all(std::nullopt, {node("x", 0)}, rules);
  auto folded = fold_queued(state, {node("y", 1), node("z", 1), node("w", 7)}, rules);
  CHECK(ids(folded.state.participants) == std::vector<std::string>{"x", "y"});
  CHECK(folded.state.queued == 3);
  REQUIRE(folded.rejected.size() == 2);
  CHECK(folded.rejected[0].first == "z");
  CHECK_THAT(folded.rejected[0].second, Catch::Contains("--node_rank 1 is already taken"));
  CHECK(folded.rejected[1].first == "w");
  CHECK_THAT(folded.rejected[1].second, Catch::Contains("--node_rank 7 is outside 0..2"));
}

TEST_CASE("round state: JSON keeps an open round's tender and queue count, and a queued node") {
  auto state = join_all(std::nullopt, {node("a")}, c10d(2, 4));
  state.queued = 5;
  auto back = decode_state(encode_state(state));
  CHECK(back.tender == "a");
  CHECK(back.queued == 5);
  auto joiner = decode_participant(encode_participant(node("q", 2)));
  CHECK(joiner.node_id == "q");
  CHECK(joiner.addr == "10.0.0.q");
  CHECK(joiner.fixed_group_rank == 2);
  CHECK(encode_participant(node("q")).find('\n') == std::string::npos);
  CHECK_THROWS_AS(decode_participant("[1, 2]"), RendezvousError);
}
