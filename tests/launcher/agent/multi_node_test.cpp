// Several ddprun agents on loopback forming one job: global ranks through the rendezvous, a
// worker failure on one node restarting every node, restarts exhausted reported on every node.
#include <catch2/catch.hpp>
#include <csignal>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "multi_node_harness.hpp"
#include "raw_socket.hpp"

using namespace ddp::test;
using nlohmann::json;

namespace {

// Starts one agent per option list, all at once, and waits for every one to exit.
std::vector<ProcessResult> run_agents(const std::vector<std::vector<std::string>>& commands) {
  std::vector<std::unique_ptr<ChildProcess>> agents;
  for (const auto& argv : commands) agents.push_back(std::make_unique<ChildProcess>(argv));
  std::vector<ProcessResult> results;
  for (auto& agent : agents) results.push_back(agent->wait(kJobTimeout));
  return results;
}

std::vector<std::string> c10d(int port, const std::string& run_id) {
  return c10d_node("2", port, run_id);
}

}  // namespace

TEST_CASE("static: two nodes with different --nproc_per_node get torchrun's global ranks") {
  TempDir dir;
  const int port = reserve_port();
  const std::string env = (dir.path() / "env-{rank}.json").string();
  auto node = [&](int rank, int nproc) {
    return ddprun({"--nnodes=2", "--node_rank=" + std::to_string(rank),
                   "--nproc_per_node=" + std::to_string(nproc), "--master_addr=127.0.0.1",
                   "--master_port=" + std::to_string(port)},
                  {"--env-json", env});
  };
  auto results = run_agents({node(1, 2), node(0, 1)});
  for (const auto& r : results) {
    INFO(r.err);
    CHECK(r.status == 0);
  }
  // Node 0's one worker is rank 0; node 1's two are ranks 1 and 2.
  const std::vector<std::tuple<int, int, int, int>> expected = {
      {0, 0, 0, 1}, {1, 0, 1, 2}, {2, 1, 1, 2}};  // rank, local rank, group rank, local world
  for (auto [rank, local_rank, group_rank, local_world] : expected) {
    json e = read_json(dir.path() / ("env-" + std::to_string(rank) + ".json"));
    CHECK(e["RANK"] == std::to_string(rank));
    CHECK(e["LOCAL_RANK"] == std::to_string(local_rank));
    CHECK(e["GROUP_RANK"] == std::to_string(group_rank));
    CHECK(e["LOCAL_WORLD_SIZE"] == std::to_string(local_world));
    CHECK(e["WORLD_SIZE"] == "3");
    CHECK(e["GROUP_WORLD_SIZE"] == "2");
    CHECK(e["ROLE_RANK"] == std::to_string(rank));
    CHECK(e["ROLE_WORLD_SIZE"] == "3");
    CHECK(e["MASTER_ADDR"] == "127.0.0.1");
    CHECK(e["MASTER_PORT"] == std::to_string(port));
    CHECK(e["TORCHELASTIC_USE_AGENT_STORE"] == "True");
  }
}

TEST_CASE("c10d: a worker failing on one node restarts every node with the next restart count") {
  TempDir dir;
  const int port = reserve_port();
  std::ofstream(dir.path() / "pass-1").put('\n');  // rank 1 passes its wait; rank 0 waits
  const std::vector<std::string> worker = {"--env-json",
                                           (dir.path() / "env-{rank}-{restart}.json").string(),
                                           "--wait-for-file",
                                           (dir.path() / "env-0-{restart}.json").string(),
                                           "--if-restart-below",
                                           "1",
                                           "--wait-for-file",
                                           (dir.path() / "pass-{rank}").string(),
                                           "--if-restart-below",
                                           "1",
                                           "--exit",
                                           "3"};
  auto options = c10d(port, "restart");
  options.push_back("--max_restarts=1");
  auto results = run_agents({ddprun(options, worker), ddprun(options, worker)});
  for (const auto& r : results) {
    INFO(r.err);
    CHECK(r.status == 0);
    CHECK_THAT(r.err, Catch::Contains("restarting it (restart 1 of at most 1)"));
  }
  for (int rank = 0; rank < 2; ++rank) {
    json e = read_json(dir.path() / ("env-" + std::to_string(rank) + "-1.json"));
    CHECK(e["TORCHELASTIC_RESTART_COUNT"] == "1");
    CHECK(e["WORLD_SIZE"] == "2");
  }
}

TEST_CASE(
    "c10d: the endpoint's port held by a connection, nobody listening: an agent hosts the store "
    "once it is free") {
  const int port = reserve_port();
  // The port held as the local end of an open loopback connection, nothing listening there:
  // as when another program's outgoing connection got it.
  SilentListener peer;
  RawSocket held(peer.port(), "", static_cast<std::uint16_t>(port));
  ChildProcess a(ddprun(c10d(port, "held"), {}));
  ChildProcess b(ddprun(c10d(port, "held"), {}));
  // Both agents could host (the endpoint is this host); both wait as clients, saying why.
  for (ChildProcess* agent : {&a, &b}) {
    agent->wait_for_stderr("ddprun: port " + std::to_string(port) +
                               " on this host is in use, but nothing accepts connections there",
                           kJobTimeout);
  }
  held.reset();  // frees the port at once
  const ProcessResult ra = a.wait(kJobTimeout), rb = b.wait(kJobTimeout);
  INFO("node a:\n" << ra.err << "\nnode b:\n" << rb.err);
  CHECK(ra.status == 0);
  CHECK(rb.status == 0);
  // Exactly one of them took the port.
  const std::string hosts = "ddprun: port " + std::to_string(port) +
                            " is free now: this agent hosts the rendezvous store there";
  CHECK((ra.err.find(hosts) != std::string::npos) != (rb.err.find(hosts) != std::string::npos));
}

TEST_CASE("c10d: restarts exhausted: every node exits non-zero naming the root cause") {
  TempDir dir;
  const int port = reserve_port();
  const std::vector<std::string> worker = {
      "--env-json",      (dir.path() / "env-{rank}.json").string(),
      "--wait-for-file", (dir.path() / "env-0.json").string(),
      "--if-rank",       "1",
      "--exit",          "3",
      "--wait"};
  auto results = run_agents(
      {ddprun(c10d(port, "exhausted"), worker), ddprun(c10d(port, "exhausted"), worker)});
  for (const auto& r : results) {
    INFO(r.err);
    CHECK(r.status == 3);
    CHECK_THAT(r.err, Catch::Contains("ddp-sample-worker FAILED"));
    CHECK_THAT(r.err, Catch::Contains("rank      : 1 (local_rank: 0)"));
    CHECK_THAT(r.err, Catch::Contains("exit      : exit code 3"));
  }
}

TEST_CASE("c10d: a node arriving while a round runs restarts the group into a larger world") {
  const int port = reserve_port();
  auto options = c10d(port, "grow");
  options[0] = "--nnodes=1:2";
  options.push_back("--rdzv_conf=last_call_timeout=0.2");
  const std::vector<std::string> worker = {"--hello", "--ready", "--wait"};
  ChildProcess first(ddprun(options, worker));
  first.wait_for_stdout_lines(" of 1 (", 1);  // a round of one: MIN is 1
  ChildProcess late(ddprun(options, worker));
  late.wait_for_stdout_lines(" of 2 (", 1);
  first.wait_for_stdout_lines(" of 2 (", 1);
  first.signal(SIGTERM);
  late.signal(SIGTERM);
  ProcessResult a = first.wait(kJobTimeout);
  ProcessResult b = late.wait(kJobTimeout);
  INFO(a.err << b.err);
  CHECK_THAT(a.err, Catch::Contains("not counted against --max_restarts"));
  CHECK(a.status == 128 + SIGTERM);
  CHECK(b.status == 128 + SIGTERM);
}

TEST_CASE("c10d: kill -9 of an agent: the other goes on in a smaller world") {
  const int port = reserve_port();
  auto options = c10d(port, "shrink");
  options[0] = "--nnodes=1:2";
  const std::string conf = "--rdzv_conf=keep_alive_interval=0.2,keep_alive_max_attempt=2";
  const std::vector<std::string> worker = {"--hello", "--ready", "--wait"};
  auto host_options = options;
  host_options.push_back(conf + ",is_host=1");  // this one serves the store; the other not
  options.push_back(conf + ",is_host=0");
  ChildProcess host(ddprun(host_options, worker));
  ChildProcess other(ddprun(options, worker));
  host.wait_for_stdout_lines(" of 2 (", 1);
  other.wait_for_stdout_lines(" of 2 (", 1);
  other.signal(SIGKILL);
  host.wait_for_stdout_lines(" of 1 (", 1);
  host.signal(SIGTERM);
  ProcessResult r = host.wait(kJobTimeout);
  INFO(r.err);
  CHECK_THAT(r.err, Catch::Contains("stopped answering"));
  CHECK(r.status == 128 + SIGTERM);
}

TEST_CASE(
    "c10d: kill -9 of the store host's agent: the other node stops at once, not after "
    "its failure budget") {
  const int port = reserve_port();
  auto options = c10d(port, "host-lost");
  // A failure budget of 60 s: only the refusal ends the round within the test's wait.
  const std::string conf = "--rdzv_conf=keep_alive_interval=20,keep_alive_max_attempt=3";
  const std::vector<std::string> worker = {"--hello", "--ready", "--wait"};
  auto host_options = options;
  host_options.push_back(conf + ",is_host=1");
  options.push_back(conf + ",is_host=0");
  ChildProcess host(ddprun(host_options, worker));
  ChildProcess other(ddprun(options, worker));
  host.wait_for_stdout_lines(" of 2 (", 1);
  other.wait_for_stdout_lines(" of 2 (", 1);
  host.signal(SIGKILL);
  host.wait(kJobTimeout);
  ProcessResult r = other.wait(std::chrono::seconds(30));
  INFO(r.err);
  CHECK(r.status == 1);
  CHECK_THAT(r.err, Catch::Contains("refuses connections"));
  CHECK(r.err.find("retries for") == std::string::npos);  // no wait for the budget
}
