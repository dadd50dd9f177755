// The life of a multi-node job beyond the happy path, with several real agents on loopback:
// an agent pre-empted by SIGTERM, a node arriving after the end, workers that fail once, a
// node 0 that never answers, and the line an agent prints while it waits for its peers.
#include <catch2/catch.hpp>
#include <csignal>
#include <memory>
#include <regex>

#include "multi_node_harness.hpp"

using namespace ddp::test;
using std::chrono::steady_clock;

namespace {

// Seconds since start, for "promptly" checks.
double seconds_since(steady_clock::time_point start) {
  return std::chrono::duration<double>(steady_clock::now() - start).count();
}

}  // namespace

TEST_CASE(
    "c10d: SIGTERM to one of 3 agents: it exits 143 and the other two finish in a world of 2") {
  TempDir dir;
  const int port = reserve_port();
  // Every worker says hello and then waits for "go", which the test makes once the smaller
  // group runs: the world-3 workers are stopped by the departure, never by "go".
  const std::vector<std::string> worker = {"--hello", "--wait-for-file",
                                           (dir.path() / "go").string()};
  auto agent = [&](const char* is_host) {
    auto options = c10d_node("2:3", port, "sigterm");
    options.push_back(std::string("--rdzv_conf=is_host=") + is_host);
    return std::make_unique<ChildProcess>(ddprun(options, worker));
  };
  auto host = agent("1");  // serves the rendezvous store; the one pre-empted is not it
  auto other = agent("0");
  auto leaving = agent("0");
  for (auto* a : {host.get(), other.get(), leaving.get()}) a->wait_for_stdout_lines(" of 3 (", 1);

  const auto start = steady_clock::now();
  leaving->signal(SIGTERM);
  ProcessResult left = leaving->wait(kJobTimeout);
  INFO("pre-empted agent:\n" << left.err);
  CHECK(left.status == 128 + SIGTERM);
  CHECK(seconds_since(start) < 15);  // workers stop at once; leave() is bounded by 5 s
  CHECK_THAT(left.err, Catch::Contains("got SIGTERM"));

  host->wait_for_stdout_lines(" of 2 (", 1, kJobTimeout);
  other->wait_for_stdout_lines(" of 2 (", 1, kJobTimeout);
  touch(dir.path() / "go");
  for (auto* a : {host.get(), other.get()}) {
    ProcessResult r = a->wait(kJobTimeout);
    INFO("survivor:\n" << r.err);
    CHECK(r.status == 0);
    CHECK_THAT(r.err, Catch::Contains("left the job"));
    CHECK_THAT(r.err, Catch::Contains("not counted against --max_restarts"));
  }
}

TEST_CASE("c10d: a node arriving after the job finished is told the rendezvous is closed") {
  // The rendezvous store is a ddpstore that outlives the job, as a dedicated store host would.
  ChildProcess store({bin_path("ddpstore").string(), "--host", "127.0.0.1", "--port", "0"});
  const std::string listening = store.wait_for_stdout_lines("listening on 127.0.0.1:", 1).at(0);
  const int port = std::stoi(listening.substr(listening.rfind(':') + 1));
  auto options = c10d_node("2", port, "finished-job");
  options.push_back("--rdzv_conf=is_host=0");
  ChildProcess a(ddprun(options, {"--hello"}));
  ChildProcess b(ddprun(options, {"--hello"}));
  for (auto* agent : {&a, &b}) {
    ProcessResult r = agent->wait(kJobTimeout);
    INFO(r.err);
    REQUIRE(r.status == 0);
  }
  const auto start = steady_clock::now();
  ProcessResult late = run_process(ddprun(options, {"--hello"}), {}, {}, kJobTimeout);
  INFO(late.out << late.err);
  CHECK(late.status != 0);
  CHECK(seconds_since(start) < 30);  // told at once, not after a join timeout
  CHECK_THAT(late.err, Catch::Contains("rendezvous 'finished-job' at 127.0.0.1:" +
                                       std::to_string(port) + " is closed: the job finished"));
  CHECK_THAT(late.out, !Catch::Contains("hello from"));
}

TEST_CASE(
    "workers failing only on their first attempt: every node succeeds with --max_restarts=1") {
  const std::string backend = GENERATE("static", "c10d");
  INFO("backend " << backend);
  TempDir dir;
  const int port = reserve_port();
  // Every worker of every node fails on attempt 0, so the nodes report failures together:
  // the job still counts one restart.
  const std::vector<std::string> worker = {"--env-json",
                                           (dir.path() / "env-{rank}-{restart}.json").string(),
                                           "--if-restart-below",
                                           "1",
                                           "--exit",
                                           "3"};
  auto options = [&](int node_rank) {
    auto o = backend == "static" ? static_node(node_rank, 2, port) : c10d_node("2", port, "once");
    o.push_back("--max_restarts=1");
    return ddprun(o, worker);
  };
  ChildProcess a(options(0));
  ChildProcess b(options(1));
  for (auto* agent : {&a, &b}) {
    ProcessResult r = agent->wait(kJobTimeout);
    INFO(r.err);
    CHECK(r.status == 0);
    CHECK_THAT(r.err, Catch::Contains("restarting it (restart 1 of at most 1)"));
  }
  for (int rank = 0; rank < 2; ++rank) {
    auto env = read_json(dir.path() / ("env-" + std::to_string(rank) + "-1.json"));
    CHECK(env["TORCHELASTIC_RESTART_COUNT"] == "1");
    CHECK(env["WORLD_SIZE"] == "2");
  }
}

TEST_CASE("static: a node that cannot reach node 0 fails after the rendezvous timeout, naming it") {
  const int port = reserve_port();  // nobody listens there
  auto options = static_node(1, 2, port);
  options.push_back("--rdzv_conf=timeout=2");
  const auto start = steady_clock::now();
  ProcessResult r = run_process(ddprun(options, {"--hello"}), {}, {}, kJobTimeout);
  const double took = seconds_since(start);
  INFO(r.err);
  CHECK(r.status != 0);
  CHECK(took >= 1.9);
  CHECK(took < 30);
  const std::regex message("could not reach the rendezvous store at 127\\.0\\.0\\.1:" +
                           std::to_string(port) + " for [0-9.]+ s");
  CHECK(std::regex_search(r.err, message));
  CHECK_THAT(r.out, !Catch::Contains("hello from"));
}

TEST_CASE("static: while node 0 waits for its peer it says for what, then the job runs") {
  const int port = reserve_port();
  ChildProcess first(ddprun(static_node(0, 2, port), {"--hello"}));
  // The first notice comes after a few seconds (then at most every 5 s).
  first.wait_for_stderr(
      "ddprun: waiting for 1 of 2 nodes at 127.0.0.1:" + std::to_string(port) + " (",
      milliseconds(20000));
  ChildProcess second(ddprun(static_node(1, 2, port), {"--hello"}));
  for (auto* agent : {&first, &second}) {
    ProcessResult r = agent->wait(kJobTimeout);
    INFO(r.err);
    CHECK(r.status == 0);
    CHECK_THAT(r.out, Catch::Contains(" of 2 ("));
  }
}

TEST_CASE("static: kill -9 of node 1's agent: node 0 reports and ends without waiting for itself") {
  const int port = reserve_port();
  // libddp workers all-reducing in steps: their records make the agents share their views
  // through the store node 0's agent serves (a connection of its own to its own store).
  const std::vector<std::string> worker = {bin_path("ddp-hang-worker").string(), "--steps",
                                           "100000", "--step-ms", "20"};
  auto node = [&](int rank) {
    std::vector<std::string> argv = {bin_path("ddprun").string()};
    for (const auto& option : static_node(rank, 2, port)) argv.push_back(option);
    argv.insert(argv.end(), worker.begin(), worker.end());
    return std::make_unique<ChildProcess>(argv);
  };
  auto host = node(0);
  auto lost = node(1);
  host->wait_for_stdout_lines("ready rank=", 1, kJobTimeout);
  lost->wait_for_stdout_lines("ready rank=", 1, kJobTimeout);
  lost->signal(SIGKILL);
  lost->wait(kJobTimeout);
  ProcessResult r = host->wait(kJobTimeout);
  INFO("node 0:\n" << r.err);
  CHECK(r.status != 0);
  CHECK_THAT(r.err, Catch::Contains("Root Cause (first observed failure):"));
  // Its store lingers only for the agents still connected: none, once its own connection
  // (the view exchange's) is closed. It used to wait out the 5 s for itself.
  CHECK_THAT(r.err, !Catch::Contains("still open"));
}
