// NetnsPair (tests/support/netns_pair.hpp): two namespaces that stand for two hosts, their
// addresses, their removal, and a store served in one and used from the other, as the
// multi-node tests use them. Skipped with the reason where namespaces cannot be made.
#include "netns_pair.hpp"

#include <catch2/catch.hpp>
#include <stdexcept>

#include "process_harness.hpp"
#include "skip.hpp"
#include "test_support.hpp"

using namespace ddp::test;
using Side = NetnsPair::Side;

namespace {

// True when `ip netns list` names the namespace.
bool netns_exists(const std::string& name) {
  ShellResult list = run_shell("ip netns list", 20);
  REQUIRE(list.status == 0);
  for (const std::string& line : lines_of(list.output)) {
    if (line.substr(0, line.find(' ')) == name) return true;
  }
  return false;
}

// The skip reason, or empty when namespaces can be made here.
std::string skip_reason() { return NetnsPair::unavailable_reason().value_or(""); }

// The port in "listening on 10.77.1.1:40123".
std::string port_of(const std::string& line) { return line.substr(line.rfind(':') + 1); }

}  // namespace

TEST_CASE("is_netns_pair_name knows the names the helper makes") {
  CHECK(is_netns_pair_name("ddpA-1234-9f3a01"));
  CHECK(is_netns_pair_name("ddpB-1-0"));
  CHECK_FALSE(is_netns_pair_name("ddpC-1234-9f3a01"));
  CHECK_FALSE(is_netns_pair_name("ddpA-12x4-9f3a01"));
  CHECK_FALSE(is_netns_pair_name("ddpA--9f3a01"));
  CHECK_FALSE(is_netns_pair_name("ddpA-1234-"));
  CHECK_FALSE(is_netns_pair_name("ddpA-1234-XYZ"));
  CHECK_FALSE(is_netns_pair_name("ddpA-1234"));
  CHECK_FALSE(is_netns_pair_name("other"));
}

TEST_CASE("NetnsPair: two namespaces, each with its own address and loopback, gone afterwards") {
  if (std::string reason = skip_reason(); !reason.empty()) {
    return ddp::test::skip(reason);
  }
  std::string names[2];
  {
    NetnsPair pair;
    names[0] = pair.name(Side::kA);
    names[1] = pair.name(Side::kB);
    CHECK(names[0] != names[1]);
    CHECK(netns_exists(names[0]));
    CHECK(netns_exists(names[1]));
    ShellResult a = pair.run_in(Side::kA, "ip -4 -o addr show", 20);
    ShellResult b = pair.run_in(Side::kB, "ip -4 -o addr show", 20);
    REQUIRE(a.status == 0);
    REQUIRE(b.status == 0);
    CHECK_THAT(a.output, Catch::Contains("veth-a    inet " + pair.address(Side::kA) + "/24"));
    CHECK_THAT(a.output, Catch::Contains("lo    inet 127.0.0.1/8"));  // lo gets it when up
    CHECK_THAT(b.output, Catch::Contains("veth-b    inet " + pair.address(Side::kB) + "/24"));
    CHECK_THAT(b.output, Catch::Contains("lo    inet 127.0.0.1/8"));
    // The addresses exist only inside the pair, not on this (the host's) namespace.
    ShellResult host = run_shell("ip -4 -o addr show", 20);
    CHECK_THAT(host.output, !Catch::Contains(pair.address(Side::kA)));
    CHECK_THAT(host.output, !Catch::Contains(pair.address(Side::kB)));
  }
  CHECK_FALSE(netns_exists(names[0]));
  CHECK_FALSE(netns_exists(names[1]));
}

TEST_CASE("NetnsPair: removed when the test fails with an exception") {
  if (std::string reason = skip_reason(); !reason.empty()) {
    return ddp::test::skip(reason);
  }
  std::string name;
  try {
    NetnsPair pair;
    name = pair.name(Side::kA);
    throw std::runtime_error("a failing test");
  } catch (const std::runtime_error&) {
  }
  REQUIRE_FALSE(name.empty());
  CHECK_FALSE(netns_exists(name));
  CHECK_FALSE(netns_exists("ddpB" + name.substr(4)));
}

TEST_CASE("NetnsPair: a pair left by a test process that died is removed by the next pair") {
  if (std::string reason = skip_reason(); !reason.empty()) {
    return ddp::test::skip(reason);
  }
  ChildProcess gone({"/bin/true"});
  REQUIRE(gone.wait().status == 0);  // reaped: its pid names no process now
  std::string stale = "ddpA-" + std::to_string(gone.pid()) + "-abc123";
  REQUIRE(run_shell("ip netns add " + stale, 20).status == 0);
  NetnsPair pair;
  bool left = netns_exists(stale);
  if (left) run_shell("ip netns del " + stale, 20);
  CHECK_FALSE(left);
}

TEST_CASE("NetnsPair: ddpstore in A serves SET and GET to a client in B at A's address",
          "[torch]") {
  if (std::string reason = skip_reason(); !reason.empty()) {
    return ddp::test::skip(reason);
  }
  if (!torch_available()) {
    return ddp::test::skip(torch_python() + " cannot import torch (the client is its TCPStore)");
  }
  NetnsPair pair;  // declared first: the store stops before its namespace goes
  ChildProcess store(pair.command_in(
      Side::kA, {bin_path("ddpstore").string(), "--host", pair.address(Side::kA), "--port", "0"}));
  auto listening = store.wait_for_stdout_lines("listening on " + pair.address(Side::kA) + ":", 1);
  std::string port = port_of(listening.at(0));
  // The client in B: A's store at A's address; B's own loopback has no store on that port.
  const char* client = R"(
import datetime, socket, sys
import torch.distributed as dist
host, port = sys.argv[1], int(sys.argv[2])
store = dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=20))
store.set("from-b", "hello from B")
print("got", store.get("from-b").decode())
try:
    socket.create_connection(("127.0.0.1", port), timeout=5)
    print("loopback answered")
except ConnectionRefusedError:
    print("loopback refused")
)";
  ProcessResult result = run_process(
      pair.command_in(Side::kB, {torch_python(), "-c", client, pair.address(Side::kA), port}));
  INFO("client stderr: " << result.err);
  CHECK(result.status == 0);
  CHECK_THAT(result.out, Catch::Contains("got hello from B"));
  CHECK_THAT(result.out, Catch::Contains("loopback refused"));
}
