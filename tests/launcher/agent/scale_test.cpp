// The control plane at scale, at the size scripts/test affords (200 agents on loopback, one
// worker each; scripts/bench-scale runs 1,000): one job forms and finishes quietly, each
// agent's store requests do not grow with the number of agents, the survivors of a lost
// agent form the next round, and one rank of 200 that stops before a collective is named.
// Workers are /bin/sh (--no_python): they print "up <WORLD_SIZE>" and, where told, wait in
// the first round until stopped; for the hang, ddp-record-worker (record_worker.cpp).
#include <catch2/catch.hpp>
#include <csignal>
#include <memory>
#include <regex>
#include <sstream>

#include "multi_node_harness.hpp"

using namespace ddp::test;

namespace {

constexpr int kAgents = 200;

// One agent of a c10d job of `nnodes` at 127.0.0.1:port running `script` under /bin/sh; the
// first is the store's host.
std::unique_ptr<ChildProcess> agent(int index, const std::string& nnodes, int port,
                                    const std::string& run_id, const std::string& script,
                                    const std::string& conf = "") {
  std::vector<std::string> argv = {bin_path("ddprun").string()};
  auto options = c10d_node(nnodes, port, run_id);
  argv.insert(argv.end(), options.begin(), options.end());
  argv.push_back("--rdzv_conf=is_host=" + std::string(index == 0 ? "1" : "0") + conf);
  argv.insert(argv.end(), {"--max_restarts=0", "--no_python", "/bin/sh", "-c", script});
  return std::make_unique<ChildProcess>(argv);
}

// ddprun's lines (stdout and stderr) that are not the waiting notices a job may print while
// its agents arrive.
std::vector<std::string> unexpected_lines(const ProcessResult& r) {
  static const std::regex notice(R"(^ddprun: waiting for \d+ of \d+ nodes .*)");
  std::vector<std::string> out;
  for (const std::string* text : {&r.out, &r.err}) {
    std::istringstream in(*text);
    for (std::string line; std::getline(in, line);) {
      if (line.starts_with("ddprun") && !std::regex_match(line, notice)) out.push_back(line);
    }
  }
  return out;
}

// Runs a job of n agents (workers exit 0 at once) against a ddpstore of its own and returns
// the requests that store served.
long job_requests(int n, const std::string& run_id) {
  ChildProcess store(
      {bin_path("ddpstore").string(), "--host", "127.0.0.1", "--port", "0", "--stats"});
  std::string line = store.next_stdout_line();
  REQUIRE(line.starts_with("listening on "));
  const int port = std::stoi(line.substr(line.rfind(':') + 1));
  std::vector<std::unique_ptr<ChildProcess>> agents;
  // No agent hosts: is_host=0 for all, so every request reaches the ddpstore.
  for (int i = 0; i < n; ++i) agents.push_back(agent(1, std::to_string(n), port, run_id, "exit 0"));
  for (auto& a : agents) {
    ProcessResult r = a->wait(kJobTimeout);
    INFO("agent:\n" << r.err);
    REQUIRE(r.status == 0);
  }
  store.signal(SIGTERM);
  line = store.next_stdout_line();
  INFO("ddpstore said: " << line);
  REQUIRE(line.starts_with("requests "));
  return std::stol(line.substr(9));
}

}  // namespace

TEST_CASE("200 agents form one c10d job, every one exits 0, and none prints a failure line") {
  const int port = reserve_port();
  std::vector<std::unique_ptr<ChildProcess>> agents;
  for (int i = 0; i < kAgents; ++i) {
    agents.push_back(agent(i, std::to_string(kAgents), port, "scale-form", "echo up $WORLD_SIZE"));
  }
  int up = 0;
  for (auto& a : agents) {
    ProcessResult r = a->wait(kJobTimeout);
    INFO("agent:\n" << r.out << r.err);
    CHECK(r.status == 0);
    CHECK(unexpected_lines(r).empty());
    if (r.out.find("up " + std::to_string(kAgents)) != std::string::npos) ++up;
  }
  CHECK(up == kAgents);
}

TEST_CASE("an agent's store requests for a job do not grow with the number of agents") {
  const long small = job_requests(50, "scale-requests-50");
  const long large = job_requests(kAgents, "scale-requests-200");
  const double per_small = static_cast<double>(small) / 50;
  const double per_large = static_cast<double>(large) / kAgents;
  INFO("requests per agent: " << per_small << " at 50 agents, " << per_large << " at " << kAgents);
  // Each agent: a few to join and read the round, a heartbeat and a wait per second, the exit
  // barrier. A protocol in which each agent reads every other's keys, or races every other's
  // writes, needs hundreds per agent at 200.
  CHECK(per_large < 60);
  CHECK(per_large < 1.5 * per_small + 10);
}

TEST_CASE("one of 200 agents killed: the other 199 form the next round and exit 0") {
  const int port = reserve_port();
  const std::string nnodes = std::to_string(kAgents - 1) + ":" + std::to_string(kAgents);
  // The first round's workers wait to be stopped; the next round's exit 0 at once.
  const std::string script = "echo up $WORLD_SIZE; [ $WORLD_SIZE = " + std::to_string(kAgents) +
                             " ] && exec sleep 600; exit 0";
  std::vector<std::unique_ptr<ChildProcess>> agents;
  for (int i = 0; i < kAgents; ++i) {
    agents.push_back(agent(i, nnodes, port, "scale-loss", script,
                           ",keep_alive_interval=1,keep_alive_max_attempt=2"));
  }
  for (auto& a : agents) a->wait_for_stdout_lines("up " + std::to_string(kAgents), 1, kJobTimeout);

  auto& lost = agents[kAgents / 2];  // not the store's host
  ::kill(lost->pid(), SIGKILL);
  lost->wait(kJobTimeout);
  int survivors = 0;
  for (auto& a : agents) {
    if (a == lost) continue;
    ProcessResult r = a->wait(kJobTimeout);
    INFO("survivor:\n" << r.out << r.err);
    CHECK(r.status == 0);
    CHECK_THAT(r.out, Catch::Contains("up " + std::to_string(kAgents - 1)));
    if (r.status == 0) ++survivors;
  }
  CHECK(survivors == kAgents - 1);
}

TEST_CASE("one rank of 200 stops before a collective: the hang is named within the timeout") {
  // Every rank records an all-reduce each 100 ms; rank 137 never enters the 30th, the others
  // wait in it. The agents' exchange and the gatherer are the real ones.
  constexpr int kHangTimeoutS = 5;
  const milliseconds slack = build_timeout(milliseconds(10000));
  const int port = reserve_port();
  std::vector<std::unique_ptr<ChildProcess>> agents;
  for (int i = 0; i < kAgents; ++i) {
    std::vector<std::string> argv = {bin_path("ddprun").string()};
    auto options = c10d_node(std::to_string(kAgents), port, "scale-hang");
    argv.insert(argv.end(), options.begin(), options.end());
    argv.insert(argv.end(),
                {"--rdzv_conf=is_host=" + std::string(i == 0 ? "1" : "0"),
                 "--hang_timeout=" + std::to_string(kHangTimeoutS), "--hang_stop_timeout=8",
                 "--shutdown_timeout=5", "--no_python", bin_path("ddp-record-worker").string(),
                 "--every-ms", "100", "--stuck-rank", "137", "--stuck-at", "30"});
    agents.push_back(std::make_unique<ChildProcess>(argv));
  }
  for (auto& a : agents) a->wait_for_stdout_lines("recording rank=", 1, kJobTimeout);
  // The hang begins about 3 s (29 all-reduces) after the last rank began recording.
  agents.front()->wait_for_stderr("the job hung at collective 30",
                                  std::chrono::seconds(3 + kHangTimeoutS) + slack);
  int stopped = 0;
  for (auto& a : agents) {
    ProcessResult r = a->wait(kJobTimeout);
    if (r.status != 0) ++stopped;  // stopped: the hang is certain
    if (a == agents.front()) {
      INFO("the host's agent:\n" << r.err);
      CHECK_THAT(r.err, Catch::Contains("ranks 0-136, 138-199 have waited in it"));
      CHECK_THAT(r.err, Catch::Contains("rank 137 (") && Catch::Contains("never entered it"));
    }
  }
  CHECK(stopped == kAgents);
}
