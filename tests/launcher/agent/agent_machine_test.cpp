// The agent's state machine in-process, with a fake rendezvous, worker group and clock (as
// ninja tests its build loop with a fake command runner): every transition without a process,
// a socket or a sleep.
#include "agent/agent_machine.hpp"

#include <catch2/catch.hpp>
#include <csignal>
#include <deque>

#include "agent_fakes.hpp"
#include "host/local_rendezvous.hpp"

using namespace ddp::launcher;
using namespace ddp::launcher::test;
using ddp::elastic::RoundInfo;
using ddp::elastic::StopReason;
using Kind = ddp::elastic::StopReason::Kind;

namespace {

constexpr auto kShutdown = std::chrono::milliseconds(3000);

// The machine with its fakes; events queue until run() hands them to handle(), as the loop.
struct Harness {
  FakeRendezvous rdzv;
  FakeWorkers workers;
  FakeTimers timers;
  std::deque<AgentEvent> queue;
  std::vector<std::string> notices;
  std::optional<AgentOutcome> outcome;
  // --restart_policy=inplace: the requests to the workers' store, answered by the test.
  std::vector<std::pair<int, std::function<void(int, std::string)>>> begins;  // rank, answer
  std::vector<std::pair<int, std::function<void(std::string)>>> watches;      // generation, answer
  AgentMachine machine;

  explicit Harness(int max_restarts = 0, bool workers_run_on = false, bool in_place = false)
      : machine(config(max_restarts, workers_run_on, in_place), context(in_place)) {
    machine.start();
  }
  static AgentMachineConfig config(int max_restarts, bool workers_run_on, bool in_place) {
    AgentMachineConfig c{"train.py",          "node-a",      max_restarts, kShutdown,
                         kOutputDrainTimeout, workers_run_on};
    c.replace_in_place = in_place;
    return c;
  }
  AgentMachineContext context(bool in_place) {
    AgentMachineContext c{&rdzv,
                          &workers,
                          &timers,
                          [this](AgentEvent e) { queue.push_back(std::move(e)); },
                          [this](const std::string& line) { notices.push_back(line); },
                          nullptr,
                          [this](AgentOutcome o) { outcome = std::move(o); },
                          nullptr,
                          nullptr};
    if (in_place) {
      c.begin_generation = [this](const RoundInfo&, int rank,
                                  std::function<void(int, std::string)> done) {
        begins.emplace_back(rank, std::move(done));
      };
      c.watch_generation = [this](const RoundInfo&, int generation, std::chrono::milliseconds,
                                  std::function<void(std::string)> done) {
        watches.emplace_back(generation, std::move(done));
      };
    }
    return c;
  }

  void run() {
    while (!queue.empty()) {
      AgentEvent e = std::move(queue.front());
      queue.pop_front();
      machine.handle(e);
    }
  }
  // The rendezvous closes the latest round.
  void round_ready(RoundInfo info) {
    rdzv.last().on_round(std::move(info));
    run();
  }
  void remote_stop(StopReason reason) {
    rdzv.last().on_stop(std::move(reason));
    run();
  }
  void exit(int local_rank, int code, int signal = 0) {
    workers.exit(local_rank, code, signal);
    run();
  }
  void advance(std::chrono::milliseconds by) {
    timers.advance(by);
    run();
  }
  bool noticed(const std::string& text) const {
    for (const auto& line : notices) {
      if (line.find(text) != std::string::npos) return true;
    }
    return false;
  }
};

// Two nodes of two workers each; this agent ("node-a") is group rank `self`.
RoundInfo two_nodes(int restart_count, int self = 1) {
  RoundInfo r;
  r.round = restart_count;
  r.restart_count = restart_count;
  r.group_rank = self;
  r.members = {{"node-b", "host-b", "10.0.0.1", 2, "default"},
               {"node-a", "host-a", "10.0.0.2", 2, "default"}};
  if (self == 0) std::swap(r.members[0], r.members[1]);
  r.master_addr = "10.0.0.1";
  r.master_port = 29500;
  return r;
}

RoundInfo one_node(int workers) {
  RoundInfo r;
  r.members = {{"node-a", "host-a", "", workers, "default"}};
  return r;
}

StopReason worker_failed(std::string node, std::string host, int rank, int exit_code) {
  StopReason r;
  r.kind = Kind::kWorkerFailed;
  r.node_id = std::move(node);
  r.host = std::move(host);
  r.rank = rank;
  r.local_rank = 0;
  r.pid = 4242;
  r.exit_code = exit_code;
  return r;
}

}  // namespace

TEST_CASE("single node: the round's workers succeed, the barrier passes, exit 0") {
  Harness h;
  REQUIRE(h.rdzv.rounds.size() == 1);
  CHECK(h.machine.state() == AgentMachine::State::kRendezvous);
  h.round_ready(one_node(2));
  REQUIRE(h.workers.starts.size() == 1);
  CHECK(h.machine.state() == AgentMachine::State::kRunning);
  h.exit(0, 0);
  CHECK(h.machine.state() == AgentMachine::State::kRunning);
  h.exit(1, 0);
  CHECK(h.machine.state() == AgentMachine::State::kBarrier);
  CHECK(h.workers.released == 1);
  REQUIRE(h.rdzv.last().on_done);
  h.rdzv.last().on_done(true);
  h.run();
  REQUIRE(h.outcome);
  CHECK(h.outcome->exit_code == 0);
  CHECK(h.outcome->report.empty());
  CHECK(h.machine.state() == AgentMachine::State::kDone);
}

TEST_CASE(
    "a local worker failure stops the round for all with the root cause, then the next round") {
  Harness h(2);
  h.round_ready(two_nodes(0));
  h.exit(1, 3);
  REQUIRE(h.rdzv.stopped.size() == 1);
  const StopReason& sent = h.rdzv.stopped[0];
  CHECK(sent.kind == Kind::kWorkerFailed);
  CHECK(sent.node_id == "node-a");
  CHECK(sent.host == "host-a");
  CHECK(sent.rank == 3);  // global: node-b's 2 workers come first
  CHECK(sent.local_rank == 1);
  CHECK(sent.exit_code == 3);
  CHECK(h.workers.signals == std::vector<int>{SIGTERM});
  CHECK(h.machine.state() == AgentMachine::State::kStopping);
  h.remote_stop(sent);               // the watcher reports the reason that won: ours
  CHECK(h.rdzv.rounds.size() == 1);  // worker 0 still runs
  h.exit(0, 0, SIGTERM);
  REQUIRE(h.rdzv.rounds.size() == 2);
  CHECK(h.noticed("restarting it (restart 1 of at most 2)"));
  CHECK(h.noticed("rank 3 on host-a: exit code 3"));
  CHECK_FALSE(h.timers.is_armed(TimerId::kKill));
  h.round_ready(two_nodes(1));
  REQUIRE(h.workers.starts.size() == 2);
  CHECK(h.workers.starts[1].restart_count == 1);
  CHECK(h.machine.state() == AgentMachine::State::kRunning);
}

TEST_CASE("a local failure whose stop the rendezvous never reports: ours after a grace period") {
  Harness h(1);
  h.round_ready(two_nodes(0));
  h.exit(0, 3);
  h.exit(1, 0, SIGTERM);
  CHECK(h.rdzv.rounds.size() == 1);  // waits for the agreed reason
  h.advance(kStopReasonGrace);
  CHECK(h.rdzv.rounds.size() == 2);
  CHECK(h.noticed("restarting it (restart 1 of at most 1)"));
}

TEST_CASE("a stop from another node: SIGTERM, SIGKILL after the shutdown timeout, next round") {
  Harness h(1);
  h.round_ready(two_nodes(0));
  h.remote_stop(worker_failed("node-b", "host-b", 0, 1));
  CHECK(h.workers.signals == std::vector<int>{SIGTERM});
  CHECK(h.rdzv.stopped.empty());  // not ours to set
  CHECK(h.noticed("stopping the workers: rank 0 on host-b: exit code 1"));
  h.advance(kShutdown - std::chrono::milliseconds(1));
  CHECK(h.workers.signals.size() == 1);
  h.advance(std::chrono::milliseconds(1));
  CHECK(h.workers.signals == std::vector<int>{SIGTERM, SIGKILL});
  h.exit(0, 0, SIGKILL);
  h.exit(1, 0, SIGKILL);
  CHECK(h.rdzv.rounds.size() == 2);
  CHECK(h.noticed("restarting it (restart 1 of at most 1)"));
}

TEST_CASE(
    "restarts exhausted by another node's failure: non-zero exit, report names its root cause") {
  Harness h(1);
  h.round_ready(two_nodes(1));  // already the one restart allowed
  StopReason reason = worker_failed("node-b", "host-b", 1, 7);
  reason.message = "RuntimeError: out of memory";
  h.remote_stop(reason);
  h.exit(0, 0, SIGTERM);
  h.exit(1, 0, SIGTERM);
  CHECK(h.rdzv.rounds.size() == 1);
  REQUIRE(h.outcome);
  CHECK(h.outcome->exit_code == 7);
  CHECK_THAT(h.outcome->report, Catch::Contains("train.py FAILED"));
  CHECK_THAT(h.outcome->report, Catch::Contains("host      : host-b"));
  CHECK_THAT(h.outcome->report, Catch::Contains("rank      : 1 (local_rank: 0)"));
  CHECK_THAT(h.outcome->report, Catch::Contains("exit      : exit code 7"));
  CHECK_THAT(h.outcome->report, Catch::Contains("message   : RuntimeError: out of memory"));
  // This node's workers, stopped by the SIGTERM, are its other failures (torchrun 2.x).
  const std::string& report = h.outcome->report;
  const std::string others = report.substr(0, report.find("Root Cause"));
  CHECK_THAT(others, Catch::Contains("host      : host-a"));
  CHECK_THAT(others, Catch::Contains("exitcode  : -15 (pid: 1000)  (SIGTERM)"));
  CHECK_THAT(others, Catch::Contains("exitcode  : -15 (pid: 1001)  (SIGTERM)"));
}

TEST_CASE(
    "restart policy none: a failed worker stops no other, and once all have exited its failure "
    "ends the round, the first failure the root cause") {
  Harness h(0, true);
  h.round_ready(two_nodes(0, 0));
  h.exit(1, 3);
  CHECK(h.workers.signals.empty());
  CHECK(h.rdzv.stopped.empty());
  CHECK(h.machine.state() == AgentMachine::State::kRunning);
  CHECK(h.noticed(
      "rank 1 failed (exit code 3); --restart_policy=none: the 1 other worker(s) here go on"));
  h.exit(0, 4);  // fails later: another failure, not the root cause
  CHECK(h.workers.signals.empty());
  REQUIRE(h.rdzv.stopped.size() == 1);
  CHECK(h.rdzv.stopped[0].rank == 1);
  CHECK(h.rdzv.stopped[0].exit_code == 3);
  h.remote_stop(h.rdzv.stopped[0]);
  REQUIRE(h.outcome);
  CHECK(h.outcome->exit_code == 3);
  CHECK_THAT(h.outcome->report, Catch::Contains("rank      : 1 (local_rank: 1)"));
  CHECK_THAT(h.outcome->report, Catch::Contains("Failures:\n[1]:"));
  CHECK(h.workers.signals.empty());
}

TEST_CASE(
    "restart policy none: another node's failure stops nothing here, and it ends the round "
    "once the workers here have exited") {
  Harness h(0, true);
  h.round_ready(two_nodes(0));
  h.remote_stop(worker_failed("node-b", "host-b", 0, 1));
  CHECK(h.workers.signals.empty());
  CHECK(h.noticed("rank 0 on host-b: exit code 1; --restart_policy=none: the workers here go on"));
  CHECK(h.machine.state() == AgentMachine::State::kRunning);
  h.exit(0, 0);
  CHECK_FALSE(h.outcome);
  h.exit(1, 0);
  REQUIRE(h.outcome);
  CHECK(h.outcome->exit_code == 1);
  CHECK_THAT(h.outcome->report, Catch::Contains("host      : host-b"));
  CHECK(h.workers.signals.empty());
}

TEST_CASE("restart policy none: a failed round restarts the group while --max_restarts allows") {
  Harness h(1, true);
  h.round_ready(two_nodes(0));
  h.exit(0, 2);
  h.exit(1, 0);
  REQUIRE(h.rdzv.stopped.size() == 1);
  h.remote_stop(h.rdzv.stopped[0]);
  CHECK(h.rdzv.rounds.size() == 2);
  CHECK(h.noticed("restarting it (restart 1 of at most 1)"));
  CHECK(h.workers.signals.empty());
}

TEST_CASE("a worker that exits 0 when the group is stopped is not a failure") {
  Harness h(0);
  h.round_ready(two_nodes(0, 0));
  h.exit(1, 3);
  h.exit(0, 0);  // its SIGTERM handler ended it cleanly
  h.remote_stop(h.rdzv.stopped.at(0));
  REQUIRE(h.outcome);
  CHECK(h.outcome->exit_code == 3);
  CHECK_THAT(h.outcome->report, Catch::Contains("Failures:\n  <NO_OTHER_FAILURES>"));
}

TEST_CASE("restarts exhausted by a local failure: its exit status and the full local report") {
  Harness h(0);
  h.round_ready(two_nodes(0, 0));
  h.workers.failed_unreported = {1};  // failed at the same moment; its event is still queued
  h.exit(0, 5);
  h.remote_stop(h.rdzv.stopped.at(0));
  h.exit(1, 9);
  REQUIRE(h.outcome);
  CHECK(h.outcome->exit_code == 5);
  CHECK_THAT(h.outcome->report, Catch::Contains("host      : host-a"));
  CHECK_THAT(h.outcome->report, Catch::Contains("rank      : 0 (local_rank: 0)"));
  CHECK_THAT(h.outcome->report, Catch::Contains("Failures:\n[1]:"));
}

TEST_CASE("a worker that cannot be started: the started ones stopped, the round ended, a report") {
  Harness h(0);
  h.workers.fail_start_at = 1;  // local rank 0 started, 1 could not
  h.round_ready(two_nodes(0, 0));
  CHECK(h.machine.state() == AgentMachine::State::kStopping);
  REQUIRE(h.rdzv.stopped.size() == 1);
  CHECK(h.rdzv.stopped[0].local_rank == 1);
  CHECK_THAT(h.rdzv.stopped[0].message, Catch::Contains("could not start the worker"));
  CHECK(h.workers.signals == std::vector<int>{SIGTERM});
  CHECK(h.noticed("could not start the worker of local_rank 1"));
  h.remote_stop(h.rdzv.stopped.at(0));
  CHECK_FALSE(h.outcome);  // local rank 0 still runs
  h.exit(0, 0, SIGTERM);
  REQUIRE(h.outcome);
  CHECK(h.outcome->exit_code == 1);
  CHECK_THAT(h.outcome->report, Catch::Contains("rank      : 1 (local_rank: 1)"));
  CHECK_THAT(h.outcome->report, Catch::Contains("message   : could not start the worker"));
}

TEST_CASE("a worker group that cannot start at all restarts while restarts remain") {
  Harness h(1);
  h.workers.fail_start_at = 0;  // nothing started: the group has exited at once
  h.round_ready(two_nodes(0, 0));
  CHECK(h.workers.released == 1);
  h.remote_stop(h.rdzv.stopped.at(0));
  CHECK(h.machine.state() == AgentMachine::State::kRendezvous);
  CHECK(h.rdzv.rounds.size() == 2);
  CHECK(h.noticed("restarting it (restart 1 of at most 1)"));
}

TEST_CASE(
    "a local failure that loses to another node's: the other is the root cause, ours listed") {
  Harness h(0);
  h.round_ready(two_nodes(0));
  h.exit(0, 2);
  h.remote_stop(worker_failed("node-b", "host-b", 0, 6));  // set first, on node-b
  h.exit(1, 0, SIGTERM);
  REQUIRE(h.outcome);
  CHECK(h.outcome->exit_code == 6);
  CHECK_THAT(h.outcome->report, Catch::Contains("host      : host-b"));
  CHECK_THAT(h.outcome->report, Catch::Contains("Failures:\n[1]:"));
  CHECK_THAT(h.outcome->report, Catch::Contains("exit      : exit code 2"));
}

TEST_CASE("membership changes re-form the group without counting a restart") {
  for (Kind kind : {Kind::kNodeJoined, Kind::kNodeLost, Kind::kNodeLeft}) {
    Harness h(0);  // no restart allowed, yet the group goes on
    h.round_ready(two_nodes(0));
    StopReason reason;
    reason.kind = kind;
    reason.node_id = "node-c";
    reason.host = "host-c";
    h.remote_stop(reason);
    h.exit(0, 0, SIGTERM);
    h.exit(1, 0, SIGTERM);
    CHECK(h.rdzv.rounds.size() == 2);
    CHECK_FALSE(h.outcome);
    CHECK(h.noticed("not counted against --max_restarts"));
    CHECK(h.noticed("host-c"));
  }
}

TEST_CASE("stop reasons in one line") {
  StopReason lost;
  lost.kind = Kind::kNodeLost;
  lost.node_id = "node-b";
  lost.host = "host-b";
  CHECK(stop_reason_text(lost) == "node host-b stopped answering (its heartbeat went stale)");
  lost.node_id.clear();  // no node: the store itself
  lost.host = "10.0.0.1";
  CHECK(stop_reason_text(lost) == "the rendezvous store at 10.0.0.1 was lost");
  lost.message = "lost etcd at e1:2379: no leader";  // the engine says what was lost
  CHECK(stop_reason_text(lost) == "lost etcd at e1:2379: no leader");
  lost.node_id = "node-b";
  lost.host = "host-b";
  lost.message = "its etcd lease expired";
  CHECK(stop_reason_text(lost) == "node host-b stopped answering (its etcd lease expired)");
  StopReason killed = worker_failed("node-b", "host-b", 5, 0);
  killed.signal = SIGKILL;
  CHECK(stop_reason_text(killed) == "rank 5 on host-b: signal SIGKILL (9)");
  // Agents on one host are told apart by the pid in their node id.
  StopReason left;
  left.kind = Kind::kNodeLeft;
  left.host = "vm";
  left.node_id = "vm_4242_0a1b2c3d";
  CHECK(stop_reason_text(left) == "node vm (agent pid 4242) left the job");
  left.host = "my_host";
  left.node_id = "my_host_77_ffff0000";
  CHECK(stop_reason_text(left) == "node my_host (agent pid 77) left the job");
}

TEST_CASE("a signal: forwarded, the rendezvous left, 128+signal, and later ones never kill") {
  Harness h(3);
  h.round_ready(two_nodes(0));
  h.machine.handle(event::Signal{SIGTERM});
  CHECK(h.workers.signals == std::vector<int>{SIGTERM});
  CHECK(h.rdzv.left == 1);
  CHECK(h.noticed("got SIGTERM: forwarding it to the workers"));
  // The same signal again: the workers have it; not forwarded, and no SIGKILL.
  h.machine.handle(event::Signal{SIGTERM});
  CHECK(h.workers.signals == std::vector<int>{SIGTERM});
  CHECK(h.noticed("SIGTERM again: the workers have it already"));
  // Another signal: forwarded once, with the whole grace again.
  h.advance(kShutdown - std::chrono::milliseconds(1000));
  h.machine.handle(event::Signal{SIGINT});
  h.machine.handle(event::Signal{SIGINT});
  CHECK(h.workers.signals == std::vector<int>{SIGTERM, SIGINT});
  CHECK(h.noticed("got SIGINT: forwarding it to the workers too"));
  h.advance(kShutdown - std::chrono::milliseconds(1));  // past SIGTERM's, within SIGINT's
  CHECK(h.workers.signals == std::vector<int>{SIGTERM, SIGINT});
  h.advance(std::chrono::milliseconds(1));  // SIGINT's --shutdown_timeout has passed
  CHECK(h.workers.signals == std::vector<int>{SIGTERM, SIGINT, SIGKILL});
  h.exit(0, 0, SIGKILL);
  h.exit(1, 0, SIGKILL);
  REQUIRE(h.outcome);
  CHECK(h.outcome->exit_code == 128 + SIGTERM);
  CHECK(h.outcome->signal == SIGTERM);
  CHECK(h.rdzv.rounds.size() == 1);
}

TEST_CASE("a signal while the workers start (waiting for the template): acted on at once") {
  Harness h(3);
  h.workers.hold_start = true;
  h.round_ready(two_nodes(1));
  CHECK(h.machine.state() == AgentMachine::State::kStarting);
  h.machine.handle(event::Signal{SIGTERM});  // the start is still waiting
  CHECK(h.workers.signals == std::vector<int>{SIGTERM});
  CHECK(h.rdzv.left == 1);
  CHECK(h.noticed("got SIGTERM: forwarding it to the workers"));
  CHECK_FALSE(h.outcome);
  h.workers.finish_start(0);  // the group gave up the start: no worker runs
  h.run();
  REQUIRE(h.outcome);
  CHECK(h.outcome->exit_code == 128 + SIGTERM);
  CHECK(h.workers.released == 1);
}

TEST_CASE("a signal while the workers start: the job ends once those that started exit") {
  Harness h(3);
  h.workers.hold_start = true;
  h.round_ready(two_nodes(1));
  h.machine.handle(event::Signal{SIGTERM});
  h.workers.finish_start(1);  // local rank 0 had been forked
  h.run();
  CHECK_FALSE(h.outcome);
  h.exit(0, 0, SIGTERM);
  REQUIRE(h.outcome);
  CHECK(h.outcome->exit_code == 128 + SIGTERM);
}

TEST_CASE("exits and a stop that come while the workers start are handled after, in order") {
  Harness h(0);
  h.workers.hold_start = true;
  h.round_ready(two_nodes(0));
  h.workers.exit(0, 3);  // forked first, it failed before the second was forked
  h.run();
  CHECK(h.machine.state() == AgentMachine::State::kStarting);
  CHECK(h.rdzv.stopped.empty());
  h.workers.finish_start(2);
  h.run();
  CHECK(h.machine.state() == AgentMachine::State::kStopping);
  REQUIRE(h.rdzv.stopped.size() == 1);
  CHECK(h.rdzv.stopped[0].local_rank == 0);
  CHECK(h.workers.signals == std::vector<int>{SIGTERM});
  h.remote_stop(h.rdzv.stopped.at(0));
  h.exit(1, 0, SIGTERM);
  REQUIRE(h.outcome);
  CHECK(h.outcome->exit_code == 3);
}

TEST_CASE("another node's stop while the workers start: the workers are stopped once started") {
  Harness h(1);
  h.workers.hold_start = true;
  h.round_ready(two_nodes(0));
  h.rdzv.last().on_stop(worker_failed("node-b", "host-b", 0, 6));
  h.run();
  CHECK(h.workers.signals.empty());
  h.workers.finish_start(2);
  h.run();
  CHECK(h.workers.signals == std::vector<int>{SIGTERM});
  h.exit(0, 0, SIGTERM);
  h.exit(1, 0, SIGTERM);
  CHECK(h.machine.state() == AgentMachine::State::kRendezvous);
  CHECK(h.rdzv.rounds.size() == 2);
}

TEST_CASE("a signal while waiting for the round: leave and exit 128+signal") {
  Harness h;
  h.machine.handle(event::Signal{SIGINT});
  CHECK(h.rdzv.left == 1);
  REQUIRE(h.outcome);
  CHECK(h.outcome->exit_code == 128 + SIGINT);
  CHECK(h.workers.starts.empty());
}

TEST_CASE("a failed exit barrier goes on with the stop the rendezvous reports") {
  Harness h(1);
  h.round_ready(two_nodes(0));
  h.exit(0, 0);
  h.exit(1, 0);
  REQUIRE(h.machine.state() == AgentMachine::State::kBarrier);
  h.rdzv.last().on_done(false);
  h.run();
  CHECK(h.machine.state() == AgentMachine::State::kStopping);
  h.remote_stop(worker_failed("node-b", "host-b", 0, 1));
  CHECK(h.rdzv.rounds.size() == 2);
  CHECK_FALSE(h.outcome);

  // A failed barrier and no reason at all: give up after a grace period, naming the barrier.
  Harness lone(1);
  lone.round_ready(two_nodes(0));
  lone.exit(0, 0);
  lone.exit(1, 0);
  lone.rdzv.last().on_done(false);
  lone.run();
  lone.advance(kStopReasonGrace);
  REQUIRE(lone.outcome);
  CHECK(lone.outcome->exit_code == 1);
  CHECK_THAT(lone.outcome->report, Catch::Contains("exit barrier"));
}

TEST_CASE("a rendezvous error ends the agent with a clear message and exit 1") {
  Harness h;
  h.rdzv.last().on_error(std::make_exception_ptr(
      ddp::elastic::RendezvousClosedError("the rendezvous of run 'job' is closed")));
  h.run();
  REQUIRE(h.outcome);
  CHECK(h.outcome->exit_code == 1);
  CHECK_THAT(h.outcome->report, Catch::Contains("10.0.0.1:29500"));
  CHECK_THAT(h.outcome->report, Catch::Contains("is closed"));
}

TEST_CASE("events of an older round are dropped") {
  Harness h(2);
  h.round_ready(two_nodes(0));
  auto old_exit = h.workers.handlers.back();
  auto old_round = h.rdzv.last();
  h.remote_stop(worker_failed("node-b", "host-b", 0, 1));
  h.exit(0, 0, SIGTERM);
  h.exit(1, 0, SIGTERM);
  REQUIRE(h.rdzv.rounds.size() == 2);
  h.round_ready(two_nodes(1));
  REQUIRE(h.workers.starts.size() == 2);
  // Late callbacks of round 1: a worker exit, a second RoundReady, a stop, a barrier result.
  old_exit(0, WorkerExit{1, 0, {}});
  old_round.on_round(two_nodes(0));
  old_round.on_stop(worker_failed("node-b", "host-b", 1, 1));
  h.queue.push_back(event::KillTimer{1});
  h.run();
  CHECK(h.machine.state() == AgentMachine::State::kRunning);
  CHECK(h.workers.starts.size() == 2);
  CHECK(h.workers.signals == std::vector<int>{SIGTERM});
  CHECK(h.rdzv.stopped.empty());
}

TEST_CASE("the waiting line is printed at most every few seconds") {
  Harness h;
  auto status = [](int joined, int min, int max, int seconds) {
    ddp::elastic::WaitStatus s;
    s.joined = joined;
    s.min_nodes = min;
    s.max_nodes = max;
    s.endpoint = "10.0.0.1:29500";
    s.waited = std::chrono::seconds(seconds);
    return s;
  };
  auto wait = [&](int joined, int seconds) {
    h.rdzv.last().on_wait(status(joined, 3, 3, seconds));
    h.run();
  };
  wait(2, 1);
  REQUIRE(h.notices.size() == 1);
  CHECK(h.notices[0] == "ddprun: waiting for 1 of 3 nodes at 10.0.0.1:29500 (1 s)");
  h.timers.now_ += std::chrono::seconds(2);
  wait(2, 3);
  CHECK(h.notices.size() == 1);
  h.timers.now_ += kWaitNoticeInterval;
  wait(1, 8);
  REQUIRE(h.notices.size() == 2);
  CHECK(h.notices[1] == "ddprun: waiting for 2 of 3 nodes at 10.0.0.1:29500 (8 s)");
  h.timers.now_ += kWaitNoticeInterval;
  h.rdzv.last().on_wait(status(2, 2, 4, 15));  // MIN joined, not MAX
  h.run();
  REQUIRE(h.notices.size() == 3);
  CHECK(h.notices[2] ==
        "ddprun: 2 of at most 4 nodes joined; waiting for the round to close at 10.0.0.1:29500 "
        "(15 s)");
  h.timers.now_ += kWaitNoticeInterval;
  auto last_call = status(2, 2, 4, 18);
  last_call.last_call_left = std::chrono::milliseconds(11500);
  h.rdzv.last().on_wait(last_call);
  h.run();
  REQUIRE(h.notices.size() == 4);
  CHECK(h.notices[3] ==
        "ddprun: 2 of at most 4 nodes joined at 10.0.0.1:29500 (18 s); last call: the round "
        "starts with these in 12 s (last_call_timeout) unless 4 join sooner");
  h.timers.now_ += kWaitNoticeInterval;
  auto listed = status(0, 2, 4, 20);
  listed.wait_listed = true;  // the round is full, or restarting without this node
  h.rdzv.last().on_wait(listed);
  h.run();
  REQUIRE(h.notices.size() == 5);
  CHECK(h.notices[4] ==
        "ddprun: a round runs without this node; waiting to join the next one at "
        "10.0.0.1:29500 (20 s)");
}

TEST_CASE("the outcome waits for the last teed output, bounded by the drain timeout") {
  Harness h;
  h.workers.pending_output = true;
  h.round_ready(one_node(1));
  h.exit(0, 0);
  h.rdzv.last().on_done(true);
  h.run();
  CHECK(h.machine.state() == AgentMachine::State::kDraining);
  CHECK_FALSE(h.outcome);
  h.machine.handle(event::OutputDrained{});
  REQUIRE(h.outcome);
  CHECK(h.outcome->exit_code == 0);

  Harness stuck;
  stuck.workers.pending_output = true;
  stuck.round_ready(one_node(1));
  stuck.exit(0, 0);
  stuck.rdzv.last().on_done(true);
  stuck.run();
  stuck.advance(kOutputDrainTimeout);
  CHECK(stuck.outcome);
}

TEST_CASE("one node through LocalRendezvous: a failure restarts at once with the next count") {
  LocalRendezvous rdzv({"node-a", "host-a", "", 2, "default", std::nullopt}, "127.0.0.1", 29511);
  FakeWorkers workers;
  FakeTimers timers;
  std::deque<AgentEvent> queue;
  std::optional<AgentOutcome> outcome;
  AgentMachine machine(
      AgentMachineConfig{"train.py", "node-a", 1, kShutdown},
      AgentMachineContext{&rdzv, &workers, &timers,
                          [&](AgentEvent e) { queue.push_back(std::move(e)); },
                          [](const std::string&) {}, nullptr,
                          [&](AgentOutcome o) { outcome = std::move(o); }, nullptr, nullptr});
  auto run = [&] {
    while (!queue.empty()) {
      AgentEvent e = std::move(queue.front());
      queue.pop_front();
      machine.handle(e);
    }
  };
  machine.start();
  run();
  REQUIRE(workers.starts.size() == 1);  // no waiting: the round closed at once
  CHECK(workers.starts[0].master_port == 29511);
  workers.exit(1, 4);
  run();
  workers.exit(0, 0, SIGTERM);
  run();
  REQUIRE(workers.starts.size() == 2);
  CHECK(workers.starts[1].restart_count == 1);
  workers.exit(0, 0);
  workers.exit(1, 0);
  run();
  REQUIRE(outcome);
  CHECK(outcome->exit_code == 0);
}

namespace {

// What the hang monitor posts for the machine's round `round`: rank 3 blamed, hung.
event::Hung hang_of(int round) {
  WorkerFailure f;
  f.host = "host-a";
  f.rank = 3;
  f.local_rank = 1;
  f.pid = 1001;
  f.exit_code = 1;
  f.hung = true;
  f.error = ErrorFileContent{"the job hung at collective 3 (all_reduce): rank 3 never entered it",
                             "the report"};
  return event::Hung{round, f};
}

}  // namespace

TEST_CASE("a hang with NCCL workers: asked to abort, SIGTERM only after the abort grace") {
  Harness h(1);
  h.workers.nccl_workers = true;
  h.round_ready(two_nodes(0));
  h.queue.push_back(hang_of(1));  // the machine counts its rounds from 1
  h.run();
  CHECK(h.workers.abort_requests == 1);
  CHECK(h.workers.signals.empty());  // they abort their communicators and exit by themselves
  REQUIRE(h.rdzv.stopped.size() == 1);
  h.advance(kAbortGrace - std::chrono::milliseconds(1));
  CHECK(h.workers.signals.empty());
  h.advance(std::chrono::milliseconds(1));
  CHECK(h.workers.signals == std::vector<int>{SIGTERM});  // one did not
  h.advance(kShutdown);
  CHECK(h.workers.signals == std::vector<int>{SIGTERM, SIGKILL});
}

TEST_CASE("a hang whose NCCL workers abort and exit in time: no signal, the round ends") {
  Harness h(1);
  h.workers.nccl_workers = true;
  h.round_ready(two_nodes(0));
  h.queue.push_back(hang_of(1));  // the machine counts its rounds from 1
  h.run();
  h.exit(0, 1);
  h.exit(1, 1);
  CHECK_FALSE(h.timers.is_armed(TimerId::kAbort));
  h.remote_stop(h.rdzv.stopped.front());  // the reason every node agrees on: ours
  h.advance(kAbortGrace);
  CHECK(h.workers.signals.empty());
  CHECK(h.rdzv.rounds.size() == 2);  // restarted
}

TEST_CASE("a hang reported by another node: Gloo workers get SIGTERM at once") {
  Harness h(1);
  h.round_ready(two_nodes(0));
  StopReason hung = worker_failed("node-b", "host-b", 0, 1);
  hung.kind = StopReason::Kind::kHung;
  hung.message = "the job hung at collective 3 (all_reduce): rank 0 never entered it";
  h.remote_stop(hung);
  CHECK(h.workers.abort_requests == 1);  // asked all the same: the record says who listens
  CHECK(h.workers.signals == std::vector<int>{SIGTERM});
  CHECK(h.noticed("stopping the workers: the job hung at collective 3"));
}

TEST_CASE("a hang travels to the other nodes as a stop reason of its own, counted as a failure") {
  Harness h(1);
  h.round_ready(two_nodes(0));
  h.queue.push_back(hang_of(1));
  h.run();
  REQUIRE(h.rdzv.stopped.size() == 1);
  CHECK(h.rdzv.stopped[0].kind == StopReason::Kind::kHung);
  CHECK(h.rdzv.stopped[0].failed());
  CHECK(h.rdzv.stopped[0].rank == 3);
}

TEST_CASE(
    "restart policy inplace: a failed worker is replaced while the others run, and counts "
    "against --max_restarts") {
  Harness h(2, false, true);
  h.round_ready(two_nodes(0));
  h.exit(1, 0, SIGKILL);
  CHECK(h.workers.signals.empty());
  CHECK(h.rdzv.stopped.empty());
  CHECK(h.noticed("rank 3 failed (signal SIGKILL (9)); --restart_policy=inplace: replacing it"));
  REQUIRE(h.begins.size() == 1);
  CHECK(h.begins[0].first == 3);
  h.begins[0].second(1, "");
  h.run();
  REQUIRE(h.workers.replaced.size() == 1);
  CHECK(h.workers.replaced[0] == std::pair<int, int>{1, 1});
  REQUIRE(h.watches.size() == 1);
  CHECK(h.watches[0].first == 1);
  h.watches[0].second("");
  h.run();
  CHECK(h.noticed("rank 3 was replaced in place: generation 1 formed"));
  CHECK(h.noticed("(1 of at most 2 restarts used)"));
  CHECK(h.machine.state() == AgentMachine::State::kRunning);
  // Every worker (the replacement included) ends: the round ends as usual.
  h.exit(0, 0);
  h.exit(1, 0);
  CHECK(h.machine.state() == AgentMachine::State::kBarrier);
  CHECK(h.workers.signals.empty());
}

TEST_CASE(
    "restart policy inplace: a program without ddprun.inplace, and a second failure during a "
    "recovery, fall back to stopping every worker with one line") {
  Harness h(2, false, true);
  h.round_ready(two_nodes(0));
  SECTION("the generation cannot begin") {
    h.exit(0, 1);
    REQUIRE(h.begins.size() == 1);
    h.begins[0].second(0, "no rank had formed its process group through ddprun.inplace");
    h.run();
    CHECK(
        h.noticed("the in-place recovery of rank 2 falls back to restarting every worker: no "
                  "rank had formed its process group through ddprun.inplace"));
  }
  SECTION("a second failure while the replacement joins") {
    h.exit(0, 1);
    h.begins[0].second(1, "");
    h.run();
    h.exit(1, 6);
    CHECK(
        h.noticed("falls back to restarting every worker: rank 3 failed too (exit code 6) while "
                  "rank 2 was being replaced"));
  }
  SECTION("a survivor that exits 0 during the recovery (it never joins)") {
    h.exit(0, 1);
    h.begins[0].second(1, "");
    h.run();
    h.exit(1, 0);
    CHECK(
        h.noticed("falls back to restarting every worker: rank 3 exited (exit code 0) while "
                  "rank 2 was being replaced"));
  }
  SECTION("a survivor that exits 0 before the generation began: the answer says why first") {
    h.exit(0, 1);
    h.exit(1, 0);
    CHECK_FALSE(h.noticed("falls back"));
    SECTION("it could not begin") {
      h.begins[0].second(0, "no rank had formed its process group through ddprun.inplace");
      h.run();
      CHECK(h.noticed("falls back to restarting every worker: no rank had formed"));
    }
    SECTION("it began") {
      h.begins[0].second(1, "");
      h.run();
      CHECK(h.workers.replaced.empty());
      CHECK(h.noticed("falls back to restarting every worker: rank 3 exited (exit code 0)"));
    }
  }
  SECTION("the generation does not form in time") {
    h.exit(0, 1);
    h.begins[0].second(1, "");
    h.run();
    h.watches[0].second("generation 1 did not form within 60 s");
    h.run();
    CHECK(h.noticed("falls back to restarting every worker: generation 1 did not form"));
  }
  REQUIRE(h.rdzv.stopped.size() == 1);
  CHECK(h.rdzv.stopped[0].rank == 2);  // the first failure is the root cause
  CHECK(h.workers.signals == std::vector<int>{SIGTERM});
}

TEST_CASE("restart policy inplace: with no restart left, a failure ends the job as under all") {
  Harness h(0, false, true);
  h.round_ready(two_nodes(0));
  h.exit(0, 1);
  CHECK(h.begins.empty());
  REQUIRE(h.rdzv.stopped.size() == 1);
  CHECK(h.workers.signals == std::vector<int>{SIGTERM});
}

TEST_CASE(
    "restart policy inplace: a hang kills only the blamed rank here, and nothing for another "
    "node's") {
  Harness h(2, false, true);
  h.round_ready(two_nodes(0));
  WorkerFailure blamed = h.workers.failure_of(1);
  blamed.hung = true;
  blamed.blamed = true;
  SECTION("the blamed rank is here") {
    h.queue.push_back(event::Hung{h.machine.round(), blamed});
    h.run();
    CHECK(h.workers.killed == std::vector<int>{1});
    CHECK(h.noticed("--restart_policy=inplace: killing rank 3 (pid 1001)"));
  }
  SECTION("it is another node's") {
    blamed.pid = 77;
    blamed.host = "host-b";
    h.queue.push_back(event::Hung{h.machine.round(), blamed});
    h.run();
    CHECK(h.workers.killed.empty());
    CHECK(h.noticed(
        "blames rank 3 on host-b; --restart_policy=inplace: its node kills and replaces it"));
  }
  CHECK(h.workers.signals.empty());
  CHECK(h.rdzv.stopped.empty());
  CHECK(h.machine.state() == AgentMachine::State::kRunning);
}

TEST_CASE(
    "restart policy inplace: a hang that blames no rank (only the first that waits) stops "
    "every worker, saying why, and kills no rank alone") {
  Harness h(2, false, true);
  h.round_ready(two_nodes(0));
  WorkerFailure waiting = h.workers.failure_of(1);
  waiting.hung = true;  // the first rank that waits: the report's root cause, not a culprit
  h.queue.push_back(event::Hung{h.machine.round(), waiting});
  h.run();
  CHECK(h.workers.killed.empty());
  CHECK(
      h.noticed("the hang diagnosis blames no rank, so no rank can be replaced: every worker "
                "is stopped, as under --restart_policy=all"));
  REQUIRE(h.rdzv.stopped.size() == 1);
  CHECK(h.rdzv.stopped[0].kind == StopReason::Kind::kHung);
}
