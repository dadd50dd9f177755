// Several ddprun agents on loopback forming one job through a real etcd cluster (three
// members from Debian's etcd-server, started by the test): PyTorch gloo across three nodes,
// the loss of the agent that hosts the workers' store, the loss of one and then two etcd
// members, etcd unreachable at start, and TLS with a right and a wrong CA. Skipped, saying
// why, where etcd (or PyTorch, for the gloo case) is missing.
#include <catch2/catch.hpp>
#include <csignal>
#include <map>
#include <memory>

#include "etcd_cluster.hpp"
#include "multi_node_harness.hpp"
#include "skip.hpp"

using namespace ddp::test;

namespace {

// Fast failure detection: a lease of 1 s, renewed every 0.25 s.
const std::string kFastConf = "keep_alive_interval=0.25,keep_alive_max_attempt=4";

// The options of one node of an etcd job, nnodes "MIN:MAX".
std::vector<std::string> etcd_node(const EtcdCluster& etcd, const std::string& nnodes,
                                   const std::string& run_id, const std::string& conf = kFastConf,
                                   int nproc = 1) {
  return {
      "--nnodes=" + nnodes,    "--rdzv_backend=etcd", "--rdzv_endpoint=" + etcd.endpoints(),
      "--rdzv_id=" + run_id,   "--rdzv_conf=" + conf, "--nproc_per_node=" + std::to_string(nproc),
      "--monitor_interval=0.1"};
}

// The agent among `agents` whose worker printed "hello from rank 0 of <world>".
std::size_t rank_zero_agent(std::vector<std::unique_ptr<ChildProcess>>& agents, int world) {
  const std::string needle = " of " + std::to_string(world) + " (";
  std::optional<std::size_t> found;
  for (std::size_t i = 0; i < agents.size(); ++i) {
    for (const auto& line : agents[i]->wait_for_stdout_lines(needle, 1)) {
      if (line.find("hello from rank 0 of") != std::string::npos) found = i;
    }
  }
  REQUIRE(found);
  return *found;
}

}  // namespace

TEST_CASE("etcd: 3 agents x 2 workers run one PyTorch gloo job through a 3-member etcd",
          "[torch]") {
  if (!EtcdCluster::available()) return skip(EtcdCluster::kMissing);
  if (!torch_available()) return skip("PyTorch with Gloo cannot be imported by " + torch_python());
  EtcdCluster etcd;
  std::vector<std::unique_ptr<ChildProcess>> agents;
  const std::map<std::string, std::string> env = {{"PYTHON_EXEC", torch_python()}};
  for (int i = 0; i < 3; ++i) {
    std::vector<std::string> argv = {bin_path("ddprun").string()};
    auto options = etcd_node(etcd, "3", "torch", "join_timeout=120", 2);
    argv.insert(argv.end(), options.begin(), options.end());
    argv.push_back(source_path("tests/launcher/agent/python/torch_allreduce.py").string());
    agents.push_back(std::make_unique<ChildProcess>(argv, env));
  }
  std::map<int, std::string> lines;
  for (auto& agent : agents) {
    ProcessResult r = agent->wait(std::chrono::milliseconds(240000));
    INFO(r.out << r.err);
    CHECK(r.status == 0);
    for (const std::string& line : lines_of(r.out)) {
      if (line.rfind("allreduce ", 0) == 0) lines[static_cast<int>(field_of(line, "rank"))] = line;
    }
  }
  REQUIRE(lines.size() == 6);
  for (const auto& [rank, line] : lines) {
    INFO(line);
    CHECK(field_of(line, "world") == 6);
    CHECK(field_of(line, "sum") == 21);  // 1 + 2 + ... + 6
  }
}

TEST_CASE("etcd: kill -9 of the agent hosting the workers' store: the others re-form and finish") {
  if (!EtcdCluster::available()) return skip(EtcdCluster::kMissing);
  EtcdCluster etcd;
  TempDir dir;
  // The workers wait until the test saw the new round (a lost node is not a restart: the
  // restart count stays 0).
  const std::vector<std::string> worker = {"--hello", "--wait-for-file",
                                           (dir.path() / "go").string()};
  std::vector<std::unique_ptr<ChildProcess>> agents;
  for (int i = 0; i < 3; ++i) {
    agents.push_back(std::make_unique<ChildProcess>(
        ddprun(etcd_node(etcd, "2:3", "host-lost", kFastConf + ",last_call_timeout=5"), worker)));
  }
  const std::size_t host = rank_zero_agent(agents, 3);
  agents[host]->signal(SIGKILL);
  agents[host]->wait(kJobTimeout);
  std::vector<std::string> masters;
  for (std::size_t i = 0; i < agents.size(); ++i) {
    if (i == host) continue;
    auto lines = agents[i]->wait_for_stdout_lines(" of 2 (", 1);
    masters.push_back(lines.front().substr(lines.front().find("master ")));
  }
  touch(dir.path() / "go");
  for (std::size_t i = 0; i < agents.size(); ++i) {
    if (i == host) continue;
    ProcessResult r = agents[i]->wait(kJobTimeout);
    INFO(r.out << r.err);
    CHECK(r.status == 0);
    CHECK_THAT(r.err, Catch::Contains("etcd lease expired"));
  }
  REQUIRE(masters.size() == 2);
  CHECK(masters[0] == masters[1]);  // one new host serves the workers' store for both
}

TEST_CASE(
    "etcd: the job goes on without one member, and without two the agents say etcd lost its "
    "quorum") {
  if (!EtcdCluster::available()) return skip(EtcdCluster::kMissing);
  EtcdCluster etcd;
  TempDir dir;
  const std::vector<std::string> worker = {"--ready", "--wait-for-file",
                                           (dir.path() / "go").string()};
  std::vector<std::unique_ptr<ChildProcess>> agents;
  for (int i = 0; i < 2; ++i) {
    agents.push_back(
        std::make_unique<ChildProcess>(ddprun(etcd_node(etcd, "2", "one-member-lost"), worker)));
  }
  for (auto& agent : agents) agent->wait_for_stdout_lines("ready rank=", 1);
  etcd.kill_member(0);
  touch(dir.path() / "go");  // the exit barrier runs on the two members left
  for (auto& agent : agents) {
    ProcessResult r = agent->wait(kJobTimeout);
    INFO(r.err);
    CHECK(r.status == 0);
  }

  // Two members gone: the agents say so and what they will do, then give up.
  std::filesystem::remove(dir.path() / "go");
  agents.clear();
  etcd.restart_member(0);
  for (int i = 0; i < 2; ++i) {
    agents.push_back(std::make_unique<ChildProcess>(
        ddprun(etcd_node(etcd, "2", "quorum-lost", kFastConf + ",join_timeout=4"), worker)));
  }
  for (auto& agent : agents) agent->wait_for_stdout_lines("ready rank=", 1);
  etcd.kill_member(1);
  etcd.kill_member(2);
  for (auto& agent : agents) {
    agent->wait_for_stderr("the workers keep running while ddprun retries");
    ProcessResult r = agent->wait(kJobTimeout);
    INFO(r.err);
    CHECK(r.status != 0);
    CHECK_THAT(r.err, Catch::Contains("a job on etcd needs a majority of its members"));
  }
}

TEST_CASE("etcd: unreachable at start is a clear error within the join timeout") {
  const std::string endpoints = "127.0.0.1:" + std::to_string(reserve_port()) +
                                ",127.0.0.1:" + std::to_string(reserve_port());
  ProcessResult r =
      run_process(ddprun({"--nnodes=2", "--rdzv_backend=etcd", "--rdzv_endpoint=" + endpoints,
                          "--rdzv_id=nobody", "--rdzv_conf=join_timeout=2"},
                         {"--exit", "0"}),
                  {}, {}, kJobTimeout);
  INFO(r.err);
  CHECK(r.status == 1);
  CHECK_THAT(r.err, Catch::Contains("could not reach etcd at " + endpoints));
  CHECK_THAT(r.err, Catch::Contains("are the etcd members running"));
}

TEST_CASE("etcd: MIN:MAX nodes on an etcd that does not answer says at once what it waits for") {
  const std::string endpoint = "127.0.0.1:" + std::to_string(reserve_port());  // nobody listens
  ChildProcess agent(ddprun({"--nnodes=1:2", "--rdzv_backend=etcd", "--rdzv_endpoint=" + endpoint,
                             "--rdzv_id=closed", "--monitor_interval=0.1"},
                            {"--exit", "0"}));
  // The first refused connection is the first failure: its line comes at once.
  agent.wait_for_stderr("waiting for etcd at " + endpoint, std::chrono::seconds(3));
  agent.signal(SIGTERM);
  ProcessResult r = agent.wait(kJobTimeout);
  INFO(r.err);
  std::vector<std::string> waiting;
  for (const std::string& line : lines_of(r.err)) {
    if (line.find("waiting for etcd at") != std::string::npos) waiting.push_back(line);
  }
  REQUIRE(!waiting.empty());
  CHECK_THAT(waiting.front(), Catch::Contains("(0 s so far, giving up in 600 s)"));
  CHECK_THAT(waiting.front(), Catch::Contains("Connection refused"));
}

TEST_CASE(
    "etcd or c10d with one node: runs alone and says in one line that the rendezvous is not "
    "contacted") {
  const std::string etcd = "127.0.0.1:" + std::to_string(reserve_port());  // nobody listens
  const std::vector<std::vector<std::string>> cases = {
      {"--rdzv_backend=etcd", "--rdzv_endpoint=" + etcd},
      {"--rdzv_backend=c10d", "--rdzv_endpoint=no-such-host.invalid:29400"}};
  for (const auto& options : cases) {
    std::vector<std::string> all = {"--nnodes=1", "--monitor_interval=0.1"};
    all.insert(all.end(), options.begin(), options.end());
    ProcessResult r = run_process(ddprun(all, {"--hello"}), {}, {}, kJobTimeout);
    INFO(options[0] << "\n" << r.err);
    CHECK(r.status == 0);
    CHECK_THAT(r.out, Catch::Contains("hello from rank 0 of 1"));
    const std::string backend = options[0].substr(options[0].find('=') + 1);
    const std::string endpoint = options[1].substr(options[1].find('=') + 1);
    std::size_t notices = 0;
    for (const std::string& line : lines_of(r.err)) {
      if (line.find("--nnodes=1: this node runs the job alone") == std::string::npos) continue;
      ++notices;
      CHECK_THAT(line, Catch::Contains("the " + backend + " rendezvous at " + endpoint +
                                       " is not contacted"));
    }
    CHECK(notices == 1);
  }
}

TEST_CASE(
    "etcd: TLS with the cluster CA and a client certificate works, and a wrong CA is refused") {
  if (!EtcdCluster::available()) return skip(EtcdCluster::kMissing);
  EtcdClusterOptions tls;
  tls.tls = true;
  EtcdCluster etcd(tls);
  const EtcdTlsFiles& files = etcd.tls_files();
  const std::string certs = ",cacert=" + files.ca.string() + ",cert=" + files.client_cert.string() +
                            ",key=" + files.client_key.string();
  std::vector<std::unique_ptr<ChildProcess>> agents;
  for (int i = 0; i < 2; ++i) {
    agents.push_back(std::make_unique<ChildProcess>(
        ddprun(etcd_node(etcd, "2", "tls", kFastConf + certs), {"--hello"})));
  }
  for (auto& agent : agents) {
    ProcessResult r = agent->wait(kJobTimeout);
    INFO(r.err);
    CHECK(r.status == 0);
    CHECK_THAT(r.out, Catch::Contains(" of 2 ("));
  }

  const std::string wrong = ",cacert=" + files.other_ca.string() +
                            ",cert=" + files.client_cert.string() +
                            ",key=" + files.client_key.string();
  ProcessResult r = run_process(
      ddprun(etcd_node(etcd, "2", "tls-wrong", kFastConf + ",join_timeout=5" + wrong), {"--hello"}),
      {}, {}, kJobTimeout);
  INFO(r.err);
  CHECK(r.status == 1);
  CHECK_THAT(r.err, Catch::Contains("refused this agent"));
  CHECK_THAT(r.err, Catch::Contains("certificate"));
}
