// Two nodes that are really two hosts: network namespaces A and B (tests/support/netns_pair),
// each with its own address, one ddprun agent in each. Static: node 0 in A hosts the store at
// A's address; c10d: the endpoint is in A, A joins first, and every worker's MASTER_ADDR is
// the address that A's agent (group rank 0) advertised. Skipped, saying why, where namespaces
// cannot be made.
#include <catch2/catch.hpp>

#include "multi_node_harness.hpp"
#include "netns_pair.hpp"

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
    WARN("skipped: " << reason);
    return;
  }
  TempDir dir;
  NetnsPair pair;  // declared after dir, before the agents: they stop before it goes
  const std::string a = pair.address(Side::kA);
  const int port = free_port();
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
    WARN("skipped: " << reason);
    return;
  }
  TempDir dir;
  NetnsPair pair;
  const std::string a = pair.address(Side::kA);
  const int port = free_port();
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
