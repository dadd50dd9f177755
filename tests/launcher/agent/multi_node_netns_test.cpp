// Two nodes that are really two hosts: network namespaces A and B (tests/support/netns_pair),
// each with its own address, one ddprun agent in each. Static: node 0 in A hosts the store at
// A's address; c10d: the endpoint is in A, A joins first, and every worker's MASTER_ADDR is
// the address that A's agent (group rank 0) advertised. Skipped, saying why, where namespaces
// cannot be made.
#include <catch2/catch.hpp>

#include "multi_node_harness.hpp"
#include "netns_pair.hpp"
#include "skip.hpp"

using namespace ddp::test;
using Side = NetnsPair::Side;
using nlohmann::json;

namespace {

std::string skip_reason() { return NetnsPair::unavailable_reason().value_or(""); }

// Runs the agents (one per side), waits for both, and checks they succeeded.
void run_both(const NetnsPair& pair, const std::vector<std::string>& a,
              const std::vector<std::string>& b) {
  ChildProcess agent_a(pair.command_in(Side::kA, a));
  ChildProcess agent_b(pair.command_in(Side::kB, b));
  for (auto* agent : {&agent_a, &agent_b}) {
    ProcessResult r = agent->wait(kJobTimeout);
    INFO(r.out << r.err);
    CHECK(r.status == 0);
  }
}

}  // namespace

TEST_CASE("netns static: node 1 in B reaches node 0's store at A's address and gets its ranks") {
  if (std::string reason = skip_reason(); !reason.empty()) {
    return ddp::test::skip(reason);
  }
  TempDir dir;
  NetnsPair pair;  // declared after dir, before the agents: they stop before it goes
  const std::string a = pair.address(Side::kA);
  const int port = reserve_port();
  auto worker = [&](const char* side) {
    return std::vector<std::string>{"--env-json",
                                    (dir.path() / (std::string(side) + "-{rank}.json")).string()};
  };
  run_both(pair, ddprun(static_node(0, 2, port, a), worker("a")),
           ddprun(static_node(1, 2, port, a), worker("b")));
  json on_a = read_json(dir.path() / "a-0.json");
  json on_b = read_json(dir.path() / "b-1.json");
  CHECK(on_a["GROUP_RANK"] == "0");
  CHECK(on_b["GROUP_RANK"] == "1");
  for (const json& e : {on_a, on_b}) {
    CHECK(e["WORLD_SIZE"] == "2");
    CHECK(e["MASTER_ADDR"] == a);
    CHECK(e["MASTER_PORT"] == std::to_string(port));
  }
}

TEST_CASE("netns c10d: endpoint in A, and B's workers get A's address (group rank 0) as master") {
  if (std::string reason = skip_reason(); !reason.empty()) {
    return ddp::test::skip(reason);
  }
  TempDir dir;
  NetnsPair pair;
  const std::string a = pair.address(Side::kA);
  const int port = reserve_port();
  auto node = [&](const char* side, const char* is_host) {
    auto options = c10d_node("2", port, "netns", a);
    options.push_back(std::string("--rdzv_conf=is_host=") + is_host);
    return ddprun(options, {"--env-json", (dir.path() / (std::string(side) + ".json")).string()});
  };
  // A joins first (it says it waits for B), so it is group rank 0 and the address its agent
  // advertises (A's) is the workers' MASTER_ADDR on both nodes.
  ChildProcess agent_a(pair.command_in(Side::kA, node("a", "1")));
  agent_a.wait_for_stderr("waiting for 1 of 2 nodes at " + a + ":" + std::to_string(port),
                          milliseconds(20000));
  ChildProcess agent_b(pair.command_in(Side::kB, node("b", "0")));
  for (auto* agent : {&agent_a, &agent_b}) {
    ProcessResult r = agent->wait(kJobTimeout);
    INFO(r.out << r.err);
    CHECK(r.status == 0);
  }
  const json on_a = read_json(dir.path() / "a.json");
  const json on_b = read_json(dir.path() / "b.json");
  CHECK(on_a["GROUP_RANK"] == "0");
  CHECK(on_b["GROUP_RANK"] == "1");
  for (const json& e : {on_a, on_b}) {
    CHECK(e["WORLD_SIZE"] == "2");
    CHECK(e["MASTER_ADDR"] == a);
    CHECK(e["MASTER_PORT"] == on_a["MASTER_PORT"]);
  }
}

namespace {

std::size_t count_of(const std::string& text, const std::string& needle) {
  std::size_t n = 0;
  for (auto at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// A third host's address: B's veth gets 10.77.N.3 too, a secondary address, so B's agent and
// workers keep using 10.77.N.2 (the primary) and only a socket bound to .3 comes from it.
std::string add_third_address(const NetnsPair& pair) {
  const std::string b = pair.address(Side::kB);
  const std::string third = b.substr(0, b.rfind('.')) + ".3";
  ShellResult added = pair.run_in(Side::kB, "ip addr add " + third + "/24 dev veth-b", 10);
  INFO(added.output);
  REQUIRE(added.status == 0);
  return third;
}

// From source (an address in B), connects to host:port and says what the server did within
// wait_ms: "closed" (at once, without a byte) or "open" (kept the connection).
std::string probe_from(const NetnsPair& pair, const std::string& source, const std::string& host,
                       const std::string& port, int wait_ms) {
  const std::string script =
      "import socket,sys\n"
      "s=socket.socket(); s.bind((sys.argv[1],0)); s.settimeout(10)\n"
      "s.connect((sys.argv[2],int(sys.argv[3]))); s.settimeout(int(sys.argv[4])/1000)\n"
      "try: print('closed' if s.recv(1)==b'' else 'data')\n"
      "except ConnectionResetError: print('closed')\n"
      "except socket.timeout: print('open')\n";
  ShellResult r = pair.run_in(Side::kB,
                              "python3 -c \"" + script + "\" " + source + " " + host + " " + port +
                                  " " + std::to_string(wait_ms),
                              20);
  INFO(r.output);
  REQUIRE(r.status == 0);
  return r.output.substr(0, r.output.find('\n'));
}

// A c10d job over A and B (A hosts the rendezvous store) whose workers meet in the workers'
// store and then wait for dir/go. Whichever node joined first is group rank 0 and serves the
// workers' store (a connection from B's third address is no member's either way). Returns
// once both nodes' workers passed the barrier.
struct StoreJob {
  StoreJob(const NetnsPair& pair, const TempDir& dir, const std::vector<std::string>& extra)
      : go(dir.path() / "go") {
    const std::string a = pair.address(Side::kA);
    const int rdzv_port = reserve_port();
    auto node = [&](const char* side, const char* is_host) {
      auto options = c10d_node("2", rdzv_port, "admit", a);
      options.push_back(std::string("--rdzv_conf=is_host=") + is_host);
      options.insert(options.end(), extra.begin(), extra.end());
      // The environment first: a worker's barrier line says its file is there.
      return ddprun(options, {"--env-json", (dir.path() / (std::string(side) + ".json")).string(),
                              "--store-barrier", "--wait-for-file", go.string()});
    };
    agent_a = std::make_unique<ChildProcess>(pair.command_in(Side::kA, node("a", "1")));
    agent_b = std::make_unique<ChildProcess>(pair.command_in(Side::kB, node("b", "0")));
    agent_a->wait_for_stdout_lines("store barrier passed", 1, kJobTimeout);
    agent_b->wait_for_stdout_lines("store barrier passed", 1, kJobTimeout);
    workers = read_json(dir.path() / "a.json");
    master = workers["MASTER_ADDR"].get<std::string>();
    port = workers["MASTER_PORT"].get<std::string>();
    CHECK(read_json(dir.path() / "b.json")["MASTER_ADDR"] == master);
    master_agent = master == pair.address(Side::kA) ? agent_a.get() : agent_b.get();
  }
  // Lets the workers end, and checks both agents succeeded.
  void finish() {
    touch(go);
    for (auto* agent : {agent_a.get(), agent_b.get()}) {
      ProcessResult r = agent->wait(kJobTimeout);
      INFO(r.out << r.err);
      CHECK(r.status == 0);
      err += r.err;
    }
  }

  std::filesystem::path go;
  std::unique_ptr<ChildProcess> agent_a, agent_b;
  json workers;                          // A's worker's environment
  std::string master, port;              // the workers' store
  ChildProcess* master_agent = nullptr;  // the agent serving it
  std::string err;                       // both agents' stderr, after finish()
};

}  // namespace

TEST_CASE("netns c10d: the workers' store serves the two nodes and refuses a third address") {
  if (std::string reason = skip_reason(); !reason.empty()) {
    return ddp::test::skip(reason);
  }
  TempDir dir;
  NetnsPair pair;
  const std::string third = add_third_address(pair);
  StoreJob job(pair, dir, {});  // both nodes' workers met in the store: members are served
  CHECK(probe_from(pair, third, job.master, job.port, 5000) == "closed");
  CHECK(probe_from(pair, third, job.master, job.port, 5000) == "closed");
  job.master_agent->wait_for_stderr("refused a connection from " + third, milliseconds(10000));
  job.finish();
  // One line for the two refusals (rate-limited per address), naming who is admitted.
  CHECK(count_of(job.err, "refused a connection from " + third) == 1);
  CHECK(count_of(job.err, "--store_allow_any") == 1);
  CHECK(count_of(job.err, "refused a connection from " + pair.address(Side::kB)) == 0);
}

TEST_CASE("netns c10d: --store_allow_any lets the third address in") {
  if (std::string reason = skip_reason(); !reason.empty()) {
    return ddp::test::skip(reason);
  }
  TempDir dir;
  NetnsPair pair;
  const std::string third = add_third_address(pair);
  StoreJob job(pair, dir, {"--store_allow_any"});
  CHECK(probe_from(pair, third, job.master, job.port, 300) == "open");
  job.finish();
  CHECK(count_of(job.err, "refused a connection") == 0);
}

TEST_CASE("netns one node on A's address: its workers get in, a peer in B is refused") {
  if (std::string reason = skip_reason(); !reason.empty()) {
    return ddp::test::skip(reason);
  }
  TempDir dir;
  NetnsPair pair;
  const std::string a = pair.address(Side::kA);
  const int port = reserve_port();
  const std::filesystem::path go = dir.path() / "go";
  // Two workers meet in the store at A's address (not loopback: it listens on every address).
  ChildProcess agent(pair.command_in(
      Side::kA, ddprun({"--nproc_per_node=2", "--master_addr=" + a,
                        "--master_port=" + std::to_string(port), "--monitor_interval=0.1"},
                       {"--store-barrier", "--wait-for-file", go.string()})));
  agent.wait_for_stdout_lines("store barrier passed", 2, kJobTimeout);
  CHECK(probe_from(pair, pair.address(Side::kB), a, std::to_string(port), 5000) == "closed");
  agent.wait_for_stderr("refused a connection from " + pair.address(Side::kB), milliseconds(10000));
  touch(go);
  ProcessResult r = agent.wait(kJobTimeout);
  INFO(r.out << r.err);
  CHECK(r.status == 0);
  CHECK(count_of(r.err, "not this host") == 1);
}

TEST_CASE("netns c10d: after a restart the new round's workers' store admits both nodes again") {
  if (std::string reason = skip_reason(); !reason.empty()) {
    return ddp::test::skip(reason);
  }
  TempDir dir;
  NetnsPair pair;
  const std::string a = pair.address(Side::kA);
  const int port = reserve_port();
  const std::filesystem::path go = dir.path() / "go";
  auto node = [&](const char* is_host) {
    auto options = c10d_node("2", port, "admit-restart", a);
    options.push_back(std::string("--rdzv_conf=is_host=") + is_host);
    options.push_back("--max_restarts=1");
    // Round 0: every worker meets the others in the store, then fails once the test has seen
    // both say so (a worker failing at once could have the other stopped before it prints);
    // round 1 (a fresh store, its admission set anew) they meet again and succeed.
    return ddprun(options, {"--store-barrier", "--if-restart-below", "1", "--wait-for-file",
                            go.string(), "--if-restart-below", "1", "--exit", "1"});
  };
  ChildProcess agent_a(pair.command_in(Side::kA, node("1")));
  ChildProcess agent_b(pair.command_in(Side::kB, node("0")));
  agent_a.wait_for_stdout_lines("store barrier passed", 1, kJobTimeout);
  agent_b.wait_for_stdout_lines("store barrier passed", 1, kJobTimeout);
  touch(go);
  for (auto* agent : {&agent_a, &agent_b}) {
    ProcessResult r = agent->wait(kJobTimeout);
    INFO(r.out << r.err);
    CHECK(r.status == 0);
    CHECK(count_of(r.out, "store barrier passed") == 2);  // once per round
    CHECK(count_of(r.err, "refused a connection") == 0);
  }
}
