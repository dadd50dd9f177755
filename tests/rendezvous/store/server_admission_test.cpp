// The store server's admission at accept: listed peers are served, others closed at once with
// a rate-limited line, and while the list is pending the unlisted are held, then judged.
// Peers differ by loopback source address (127.0.0.1 and 127.0.0.2), so no namespaces needed.

#include <catch2/catch.hpp>
#include <future>

#include "ddp/store/client.hpp"
#include "ddp/store/server.hpp"
#include "raw_socket.hpp"
#include "store_fixture.hpp"

using namespace ddp::store;
using ddp::test::eventually;
using ddp::test::RawSocket;
using ddp::test::TestServer;
using namespace std::chrono_literals;

namespace {

ServerOptions admitting(Admission admission, std::size_t max_held = kDefaultMaxHeldConnections) {
  ServerOptions options;
  options.admission = std::move(admission);
  options.max_held_connections = max_held;
  return options;
}

Admission only_first_loopback() {
  return Admission::only({Network::parse("127.0.0.1")}, "not a node of this job");
}

std::size_t lines_naming(const TestServer& server, const std::string& text) {
  std::size_t n = 0;
  for (const auto& line : server.log()) n += line.find(text) != std::string::npos;
  return n;
}

}  // namespace

TEST_CASE("server admission: a listed peer is served, others are closed with one line a minute") {
  TestServer server(admitting(only_first_loopback()));
  Client client(server.client_options());
  client.set("k", "v");
  CHECK(client.get("k") == "v");

  for (int i = 0; i < 5; ++i) {
    RawSocket stranger(server.port(), "127.0.0.2");
    CHECK(stranger.closed_by_peer());
  }
  CHECK(eventually([&] { return server.stats().refused == 5; }));
  CHECK(lines_naming(server, "refused a connection from 127.0.0.2: not a node of this job") == 1);
  CHECK(server.log().size() == 1);
  // The member's connection is untouched by it all.
  CHECK(client.get("k") == "v");
  CHECK(server.stats().connections == 1);
}

TEST_CASE("server admission: anyone (the default) serves every loopback address") {
  TestServer server;
  RawSocket other(server.port(), "127.0.0.2");
  CHECK(eventually([&] { return server.stats().connections == 1; }));
  CHECK_FALSE(other.closed_by_peer(50ms));
  CHECK(server.stats().refused == 0);
}

TEST_CASE("server admission: while pending, unlisted peers wait unread, then are judged") {
  TestServer server(admitting(Admission::pending({})));
  // A client from 127.0.0.1 connects; its handshake waits in the kernel until it is admitted.
  auto member = std::async(std::launch::async, [&] {
    Client client(server.client_options());
    client.set("k", "v");
    return client.get("k");
  });
  RawSocket stranger(server.port(), "127.0.0.2");
  REQUIRE(eventually([&] { return server.stats().held == 2; }));
  CHECK(server.stats().connections == 0);
  CHECK(member.wait_for(0s) == std::future_status::timeout);

  server.set_admission(only_first_loopback());
  REQUIRE(member.wait_for(10s) == std::future_status::ready);
  CHECK(member.get() == "v");
  CHECK(stranger.closed_by_peer());
  CHECK(server.stats().held == 0);
  REQUIRE(eventually([&] { return server.stats().refused == 1; }));
  CHECK(lines_naming(server, "refused a connection from 127.0.0.2") == 1);
}

TEST_CASE("server admission: past max_held_connections a pending server refuses") {
  TestServer server(admitting(Admission::pending({}), /*max_held=*/1));
  RawSocket first(server.port(), "127.0.0.2");
  REQUIRE(eventually([&] { return server.stats().held == 1; }));
  RawSocket second(server.port(), "127.0.0.2");
  CHECK(second.closed_by_peer());
  REQUIRE(eventually([&] { return server.stats().refused == 1; }));
  CHECK(lines_naming(server, "already holding 1 connection(s)") == 1);
  CHECK(server.stats().held == 1);
  // Deciding for everyone serves the one held.
  server.set_admission(Admission::anyone());
  CHECK(eventually([&] { return server.stats().connections == 1; }));
  CHECK_FALSE(first.closed_by_peer(50ms));
}
