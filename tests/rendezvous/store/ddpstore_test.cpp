// build/bin/ddpstore: prints where it listens, serves, exits 0 on SIGINT/SIGTERM.

#include <signal.h>

#include <catch2/catch.hpp>

#include "ddp/store/client.hpp"
#include "process_harness.hpp"
#include "store_fixture.hpp"
#include "test_support.hpp"

using namespace ddp::store;
using ddp::test::ChildProcess;

namespace {

std::uint16_t port_of(const std::string& line) {
  REQUIRE(line.rfind("listening on 127.0.0.1:", 0) == 0);
  return static_cast<std::uint16_t>(std::stoi(line.substr(line.rfind(':') + 1)));
}

}  // namespace

TEST_CASE("ddpstore serves on the port it prints and exits 0 on SIGTERM and SIGINT") {
  for (int signal : {SIGTERM, SIGINT}) {
    ChildProcess store(
        {ddp::test::bin_path("ddpstore").string(), "--host", "127.0.0.1", "--port", "0"});
    std::uint16_t port = port_of(store.next_stdout_line());
    ClientOptions options;
    options.port = port;
    Client client(options);
    client.set("k", "v");
    CHECK(client.get("k") == "v");
    REQUIRE(::kill(store.pid(), signal) == 0);
    CHECK(store.wait().status == 0);
  }
}

TEST_CASE("ddpstore on a port in use says so and exits non-zero") {
  ChildProcess first(
      {ddp::test::bin_path("ddpstore").string(), "--host", "127.0.0.1", "--port", "0"});
  std::uint16_t port = port_of(first.next_stdout_line());
  ChildProcess second({ddp::test::bin_path("ddpstore").string(), "--host", "127.0.0.1", "--port",
                       std::to_string(port)});
  CHECK(second.next_stdout_line().empty());
  CHECK(second.wait().status == 1);
}

TEST_CASE("ddpstore exits 0 on a SIGTERM sent as soon as it printed where it listens") {
  // The signal handler must be in place before the line that tells the port.
  for (int i = 0; i < 10; ++i) {
    ChildProcess store(
        {ddp::test::bin_path("ddpstore").string(), "--host", "127.0.0.1", "--port", "0"});
    port_of(store.next_stdout_line());
    REQUIRE(::kill(store.pid(), SIGTERM) == 0);
    CHECK(store.wait().status == 0);
  }
}

TEST_CASE("ddpstore's budget and cap flags reach its server") {
  ChildProcess store({ddp::test::bin_path("ddpstore").string(), "--host", "127.0.0.1", "--port",
                      "0", "--max-stored-bytes", "1000", "--max-queued-reply-bytes", "100000",
                      "--max-waits-per-connection", "2"});
  ClientOptions options;
  options.port = port_of(store.next_stdout_line());
  Client client(options);
  client.set("fits", std::string(900, 'a'));
  client.set("over", std::string(200, 'b'));  // past --max-stored-bytes: the connection closes
  CHECK_THROWS_AS(client.num_keys(), StoreError);
  Client other(options);
  CHECK(other.num_keys() == 1);
  REQUIRE(::kill(store.pid(), SIGTERM) == 0);
  CHECK(store.wait().status == 0);
}
