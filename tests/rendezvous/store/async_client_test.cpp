// AsyncClient on a caller's io_context: handlers, deadlines, connect retries, the local
// address. Everything runs on the test's thread; assertions come after the loop ran.

#include "ddp/store/async_client.hpp"

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <catch2/catch.hpp>

#include "ddp/store/local_address.hpp"
#include "ddp/store/server.hpp"
#include "store_fixture.hpp"
#include "test_support.hpp"

using namespace ddp::store;
using namespace std::chrono_literals;
using ddp::test::TestServer;

namespace {

// Runs io until done() holds or timeout passed; true when done() holds.
bool run_until(boost::asio::io_context& io, const std::function<bool()>& done,
               std::chrono::milliseconds timeout = 10s) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  io.restart();
  while (!done() && std::chrono::steady_clock::now() < deadline) io.run_one_for(50ms);
  return done();
}

// What one handler was given.
struct Outcome {
  bool done = false;
  std::string error;  // what() of the error; empty on success
  bool timeout = false;
  Reply reply;
};

AsyncClient::ReplyHandler record(Outcome& out) {
  return [&out](std::exception_ptr e, Reply reply) {
    out.done = true;
    out.reply = std::move(reply);
    if (!e) return;
    try {
      std::rethrow_exception(e);
    } catch (const StoreTimeout& t) {
      out.error = t.what();
      out.timeout = true;
    } catch (const StoreError& s) {
      out.error = s.what();
    }
  };
}

}  // namespace

TEST_CASE("AsyncClient: requests complete through their handlers, in order, on the caller's loop") {
  TestServer server;
  boost::asio::io_context io;
  for (Dialect dialect : {Dialect::V1, Dialect::V2}) {
    CAPTURE(dialect_name(dialect));
    AsyncClient client(io, server.client_options(dialect));
    Outcome set, add, get, keys;
    client.request(make_request(Command::Set, {"k"}, {"v"}), "set 'k'", 5s, record(set));
    client.request(make_request(Command::Add, {"n"}, {}, 5), "add 'n'", 5s, record(add));
    client.request(make_request(Command::Get, {"k"}), "get 'k'", 5s, record(get));
    client.request(make_request(Command::GetNumKeys), "num_keys", 5s, record(keys));
    REQUIRE(run_until(io, [&] { return keys.done; }));
    CHECK(set.done);
    CHECK(set.error.empty());
    CHECK(add.reply.number == 5);
    CHECK(get.reply.values == std::vector<std::string>{"v"});
    CHECK(keys.reply.number == 2);
    CHECK(client.connected());
    Outcome deleted;
    client.request(make_request(Command::DeleteKey, {"n"}), "delete_key 'n'", 5s, record(deleted));
    REQUIRE(run_until(io, [&] { return deleted.done; }));
    CHECK(deleted.reply.number == 1);
  }
}

TEST_CASE("AsyncClient: a 2.x wait past its deadline is canceled and the connection stays usable") {
  TestServer server;
  boost::asio::io_context io;
  AsyncClient client(io, server.client_options());
  Outcome waited, after;
  client.wait({"never"}, "wait", 100ms, record(waited));
  client.request(make_request(Command::Set, {"k"}, {"v"}), "set 'k'", 5s, record(after));
  REQUIRE(run_until(io, [&] { return after.done; }));
  CHECK(waited.timeout);
  CHECK_THAT(waited.error, Catch::Contains("'never'"));
  CHECK_THAT(waited.error, Catch::Contains("127.0.0.1:" + std::to_string(server.port())));
  CHECK(after.error.empty());
  CHECK(server.stats().accepted == 1);  // one connection all along
  CHECK(server.stats().waits == 0);
  Outcome present;
  client.wait({"k"}, "wait", 5s, record(present));
  REQUIRE(run_until(io, [&] { return present.done; }));
  CHECK(present.error.empty());
}

TEST_CASE("AsyncClient: a request whose reply does not come in time fails with StoreTimeout") {
  ddp::test::SilentListener silent;  // accepts (the kernel does) and never answers
  boost::asio::io_context io;
  ClientOptions options;
  options.port = silent.port();
  options.dialect = Dialect::V1;  // no handshake
  AsyncClient client(io, options);
  Outcome keys;
  const auto start = std::chrono::steady_clock::now();
  client.request(make_request(Command::GetNumKeys), "num_keys", 200ms, record(keys));
  REQUIRE(run_until(io, [&] { return keys.done; }));
  CHECK(keys.timeout);
  CHECK_THAT(keys.error, Catch::Contains("num_keys: timed out after 200 ms"));
  CHECK(std::chrono::steady_clock::now() - start < 5s);
  CHECK_FALSE(client.connected());  // dropped: the reply may still come
}

TEST_CASE("AsyncClient: connect retries until the server is listening") {
  boost::asio::io_context io;
  const auto port = static_cast<std::uint16_t>(ddp::test::reserve_port());
  ClientOptions options;
  options.port = port;
  options.connect_timeout = 10s;
  AsyncClient client(io, options);
  std::unique_ptr<Server> server;
  boost::asio::steady_timer later(io, 300ms);  // the server comes up after a few attempts
  later.async_wait([&](const boost::system::error_code&) {
    ServerOptions server_options;
    server_options.host = "127.0.0.1";
    server_options.port = port;
    server_options.logger = [](std::string_view) {};
    server = std::make_unique<Server>(io, server_options);
  });
  bool connected = false;
  std::string error;
  client.connect([&](std::exception_ptr e) {
    connected = !e;
    if (e) error = "failed";
  });
  REQUIRE(run_until(io, [&] { return connected || !error.empty(); }));
  CHECK(connected);
  CHECK(server->stats().accepted == 1);
  server->close();
}

TEST_CASE(
    "AsyncClient: no server within connect_timeout fails every request, naming the endpoint") {
  boost::asio::io_context io;
  ClientOptions options;
  options.port = static_cast<std::uint16_t>(ddp::test::reserve_port());
  options.connect_timeout = 300ms;
  AsyncClient client(io, options);
  Outcome first, second;
  client.request(make_request(Command::GetNumKeys), "num_keys", 5s, record(first));
  client.request(make_request(Command::Check, {"k"}), "check", 5s, record(second));
  REQUIRE(run_until(io, [&] { return first.done && second.done; }));
  CHECK_THAT(first.error, Catch::Contains("127.0.0.1:" + std::to_string(options.port)));
  CHECK_THAT(first.error, Catch::Contains("no store server answered within 300 ms"));
  CHECK_FALSE(second.error.empty());
}

TEST_CASE("AsyncClient: close() fails what is pending, its handlers run on the loop") {
  TestServer server;
  boost::asio::io_context io;
  auto client = std::make_unique<AsyncClient>(io, server.client_options());
  Outcome waiting;
  client->wait({"never"}, "wait", 10s, record(waiting));
  REQUIRE(run_until(io, [&] { return server.stats().waits == 1; }));
  client.reset();             // closes
  CHECK_FALSE(waiting.done);  // posted, not called from inside the destructor
  REQUIRE(run_until(io, [&] { return waiting.done; }));
  CHECK_THAT(waiting.error, Catch::Contains("closed"));
  CHECK(ddp::test::eventually([&] { return server.stats().connections == 0; }));
}

TEST_CASE("local_address_towards names this host's address on the route to a server") {
  CHECK(ddp::store::local_address_towards("127.0.0.1", 29500) == "127.0.0.1");
  CHECK(ddp::store::local_address_towards("no-such-host.invalid", 29500).empty());
}
