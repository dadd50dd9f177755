// Every command through our Client against our Server, in both dialects, and the
// connection-closing rules for bad requests.

#include <catch2/catch.hpp>
#include <ctime>
#include <limits>
#include <thread>

#include "add_forms.hpp"
#include "ddp/store/client.hpp"
#include "ddp/store/prefix_store.hpp"
#include "ddp/store/server.hpp"
#include "raw_socket.hpp"
#include "store_fixture.hpp"
#include "test_support.hpp"

using namespace ddp::store;
using ddp::test::eventually;
using ddp::test::RawSocket;
using ddp::test::TestServer;
using namespace std::chrono_literals;

namespace {

std::string bytes(std::initializer_list<int> list) {
  std::string out;
  for (int b : list) out.push_back(static_cast<char>(b));
  return out;
}

bool log_mentions(const TestServer& server, const std::string& text) {
  for (const auto& line : server.log()) {
    if (line.find(text) != std::string::npos && line.find("127.0.0.1:") != std::string::npos) {
      return true;
    }
  }
  return false;
}

}  // namespace

TEST_CASE("client and server: the common commands in both dialects") {
  for (Dialect dialect : {Dialect::V1, Dialect::V2}) {
    CAPTURE(dialect_name(dialect));
    TestServer server;
    Client client(server.client_options(dialect));
    CHECK(client.dialect() == dialect);

    client.set("k1", "v1");
    CHECK(client.get("k1") == "v1");
    client.set("k1", std::string("\0bin\xff", 5));
    CHECK(client.get("k1") == std::string("\0bin\xff", 5));

    CHECK(client.add("counter", 5) == 5);
    CHECK(client.add("counter", -7) == -2);
    CHECK(client.get("counter") == "-2");  // ADD keeps decimal text

    // COMPARE_SET: PyTorch's four cases.
    CHECK(client.compare_set("cas", "", "first") == "first");  // missing, empty expected
    CHECK(client.compare_set("absent", "x", "y") == "x");      // missing, non-empty expected
    CHECK_FALSE(client.check({"absent"}));
    CHECK(client.compare_set("cas", "first", "second") == "second");  // equal
    CHECK(client.compare_set("cas", "wrong", "third") == "second");   // different

    CHECK(client.check({"k1", "counter"}));
    CHECK_FALSE(client.check({"k1", "nope"}));
    CHECK(client.num_keys() == 3);
    CHECK(client.delete_key("cas"));
    CHECK_FALSE(client.delete_key("cas"));
    CHECK(client.num_keys() == 2);

    client.multi_set({"m1", "m2"}, {"a", "b"});
    CHECK(client.multi_get({"m2", "m1", "k1"}) ==
          std::vector<std::string>{"b", "a", std::string("\0bin\xff", 5)});
    client.append("log", "ab");
    client.append("log", "cd");
    CHECK(client.get("log") == "abcd");
    CHECK(client.ping() > 0ns);

    PrefixStore prefixed("/worker/attempt_0",
                         std::make_shared<Client>(server.client_options(dialect)));
    prefixed.set("x", "1");
    CHECK(client.get("/worker/attempt_0/x") == "1");
  }
}

TEST_CASE("clear_keys: every value and queue is gone, a connection and its wait stay") {
  TestServer server;
  Client client(server.client_options(Dialect::V2));
  client.set("/worker/0//cpu//0/1", "attempt 0's address");
  client.add("counter", 5);
  client.queue_push("q", "x");
  Client waiter(server.client_options(Dialect::V2));
  server.clear_keys();
  CHECK(client.num_keys() == 0);
  CHECK_FALSE(client.check({"/worker/0//cpu//0/1"}));
  CHECK(client.add("counter", 1) == 1);  // a fresh counter
  CHECK(client.queue_len("q") == 0);
  // A client connected before goes on, and a key set afresh is what it reads.
  client.set("/worker/0//cpu//0/1", "attempt 1's address");
  waiter.wait({"/worker/0//cpu//0/1"}, 5s);
  CHECK(waiter.get("/worker/0//cpu//0/1") == "attempt 1's address");
}

TEST_CASE(
    "reset_after_set: the SET or COMPARE_SET it names erases every key and queue but those "
    "under keep_on_reset, before the next request, and the store's budget counts what is left") {
  ServerOptions options;
  options.reset_after_set = [](std::string_view key, std::string_view value) {
    return key == "/ddprun/run/round_1/closed" || value == "reset";
  };
  options.keep_on_reset = {"/ddprun/", "ddprun/"};
  TestServer server(options);
  Client agent(server.client_options(Dialect::V2));
  Client worker(server.client_options(Dialect::V1));
  agent.set("/ddprun/run/state", "running");
  agent.add("ddprun/collectives/0/verdict/seq", 3);
  worker.set("default_pg/0//cpu//0/rank_0", "attempt 0's address");
  worker.add("/worker/attempt_0/init/", 2);
  agent.queue_push("work", "x");
  agent.set("/ddprun/run/round_0/closed", "1");  // not the one named: nothing goes
  CHECK(agent.num_keys() == 5);
  const std::int64_t before = server.stats().stored_bytes;
  agent.set("/ddprun/run/round_1/closed", "1");
  // The next request sees the reset already done.
  CHECK_FALSE(worker.check({"default_pg/0//cpu//0/rank_0"}));
  CHECK_FALSE(worker.check({"/worker/attempt_0/init/"}));
  CHECK(agent.queue_len("work") == 0);
  CHECK(agent.get("/ddprun/run/state") == "running");
  CHECK(agent.add("ddprun/collectives/0/verdict/seq", 0) == 3);
  CHECK(agent.check({"/ddprun/run/round_0/closed", "/ddprun/run/round_1/closed"}));
  CHECK(agent.num_keys() == 4);
  CHECK(server.stats().stored_bytes < before);
  // The next attempt's workers write afresh.
  worker.set("default_pg/0//cpu//0/rank_0", "attempt 1's address");
  CHECK(agent.get("default_pg/0//cpu//0/rank_0") == "attempt 1's address");
  // A COMPARE_SET is judged by the value the key holds after it: a lost one changes nothing.
  CHECK(agent.compare_set("/ddprun/run/state", "open", "reset") == "running");
  CHECK(worker.check({"default_pg/0//cpu//0/rank_0"}));
  CHECK(agent.compare_set("/ddprun/run/state", "running", "reset") == "reset");
  CHECK_FALSE(worker.check({"default_pg/0//cpu//0/rank_0"}));
  CHECK(agent.get("/ddprun/run/state") == "reset");
}

TEST_CASE("clock key: an ADD to it reads the server's clock and stores nothing") {
  ServerOptions options;
  options.clock_key = kClockKey;
  TestServer server(options);
  for (Dialect dialect : {Dialect::V1, Dialect::V2}) {
    CAPTURE(dialect_name(dialect));
    Client client(server.client_options(dialect));
    auto now = [] {
      timespec t{};
      ::clock_gettime(CLOCK_MONOTONIC, &t);
      return static_cast<std::int64_t>(t.tv_sec) * 1000000000LL + t.tv_nsec;
    };
    const std::int64_t before = now();
    const std::int64_t first = client.add(kClockKey, 0);
    const std::int64_t second = client.add(kClockKey, 0);
    const std::int64_t after = now();
    CHECK(before <= first);  // one host: the same clock
    CHECK(first <= second);
    CHECK(second <= after);
    CHECK_FALSE(client.check({kClockKey}));
    CHECK(client.num_keys() == 0);
  }
  TestServer plain;  // without the option it is an ordinary counter
  Client client(plain.client_options(Dialect::V2));
  CHECK(client.add(kClockKey, 0) == 0);
}

TEST_CASE("client and server: WAIT is answered when the last key appears") {
  for (Dialect dialect : {Dialect::V1, Dialect::V2}) {
    CAPTURE(dialect_name(dialect));
    TestServer server;
    Client waiter(server.client_options(dialect));
    Client setter(server.client_options(dialect));
    setter.set("a", "1");
    std::thread t([&] {
      // Wait until the waiter is registered on the server, then set the missing keys.
      REQUIRE(eventually([&] { return server.stats().waits == 1; }));
      setter.set("b", "2");
      CHECK(server.stats().waits == 1);  // still waiting for c
      setter.multi_set({"c"}, {"3"});
    });
    waiter.wait({"a", "b", "c"}, 10s);
    t.join();
    CHECK(server.stats().waits == 0);
    CHECK(waiter.get("c") == "3");
  }
}

TEST_CASE("client and server: a wait that times out is canceled and the client stays usable") {
  for (Dialect dialect : {Dialect::V1, Dialect::V2}) {
    CAPTURE(dialect_name(dialect));
    TestServer server;
    Client client(server.client_options(dialect));
    CHECK_THROWS_AS(client.wait({"never"}, 50ms), StoreTimeout);
    try {
      client.wait({"never"}, 20ms);
    } catch (const StoreTimeout& e) {
      CHECK_THAT(e.what(), Catch::Contains("127.0.0.1:" + std::to_string(server.port())));
      CHECK_THAT(e.what(), Catch::Contains("'never'"));
    }
    REQUIRE(eventually([&] { return server.stats().waits == 0; }));
    client.set("after", "ok");
    CHECK(client.get("after") == "ok");
  }
}

TEST_CASE("client and server: 2.x queues") {
  TestServer server;
  Client client(server.client_options());
  CHECK(client.queue_len("q") == 0);
  client.queue_push("q", "one");
  client.queue_push("q", "two");
  CHECK(client.queue_len("q") == 2);
  CHECK(client.check({"q"}));
  CHECK(client.queue_pop("q", 1s) == "one");
  CHECK(client.queue_pop("q", 1s) == "two");
  CHECK_THROWS_AS(client.queue_pop("q", 30ms), StoreTimeout);

  Client pusher(server.client_options());
  std::thread t([&] {
    REQUIRE(eventually([&] { return server.stats().waits == 1; }));
    pusher.queue_push("q", "late");
  });
  CHECK(client.queue_pop("q", 10s) == "late");
  t.join();

  Client v1(server.client_options(Dialect::V1));
  CHECK_THROWS_AS(v1.queue_len("q"), StoreError);
}

TEST_CASE("raw 2.x: CANCEL_WAIT answers WAIT_CANCELED and PING echoes the nonce") {
  TestServer server;
  RawSocket s(server.port());
  s.send(bytes({0x00, 0xCE, 0xF7, 0x85, 0x3C}));
  s.send(bytes({0x0d, 0x78, 0x56, 0x34, 0x12}));
  CHECK(s.read(4) == bytes({0x78, 0x56, 0x34, 0x12}));
  // WAIT for "w", then CANCEL_WAIT.
  s.send(bytes({0x06, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 'w'}));
  REQUIRE(eventually([&] { return server.stats().waits == 1; }));
  s.send(bytes({0x0c}));
  CHECK(s.read(1) == bytes({0x01}));
  CHECK(server.stats().waits == 0);
  // GETNUMKEYS still answered on the same connection.
  s.send(bytes({0x07}));
  CHECK(s.read(8) == bytes({0, 0, 0, 0, 0, 0, 0, 0}));
}

TEST_CASE("raw 1.x: WATCH_KEY registers and reports changes") {
  TestServer server;
  RawSocket watch(server.port());
  watch.send(bytes({0x07, 1, 0, 0, 0, 0, 0, 0, 0, 'k'}));
  CHECK(watch.read(1) == bytes({0x03}));
  Client client(server.client_options(Dialect::V1));
  client.set("k", "v");
  // KEY_CREATED, key, old "", new "v".
  CHECK(watch.read(1 + 9 + 8 + 9) == bytes({0x01, 1, 0, 0, 0, 0, 0, 0, 0, 'k', 0, 0, 0,  0,
                                            0,    0, 0, 0, 1, 0, 0, 0, 0, 0,   0, 0, 'v'}));
  client.delete_key("k");
  CHECK(watch.read(1 + 9 + 9 + 8) == bytes({0x02, 1, 0, 0, 0,   0, 0, 0, 0, 'k', 1, 0, 0, 0,
                                            0,    0, 0, 0, 'v', 0, 0, 0, 0, 0,   0, 0, 0}));
}

TEST_CASE("bad requests close only their own connection, with a logged reason") {
  TestServer server;
  Client good(server.client_options());
  good.set("text", "not a number");
  REQUIRE(good.get("text") == "not a number");  // stored before the raw requests arrive

  struct Case {
    std::string name;
    std::string wire;
    std::string reason;
  };
  std::vector<Case> cases = {
      {"unknown 1.x command", bytes({0x0b}), "unknown command byte 0x0b in the 1.x dialect"},
      {"unknown 2.x command", bytes({0x00, 0xCE, 0xF7, 0x85, 0x3C, 0x33}),
       "unknown command byte 0x33 in the 2.x dialect"},
      {"wrong magic", bytes({0x00, 0xCE, 0xF7, 0x85, 0x3C, 0x00, 1, 2, 3, 4}),
       "wrong magic 0x04030201"},
      {"oversize key", bytes({0x02, 0, 0, 0, 0, 0, 0, 0, 0x80}), "exceeds the limit of 8192 bytes"},
      {"non-numeric ADD",
       bytes({0x03, 4, 0, 0, 0, 0, 0, 0, 0}) + "text" + bytes({1, 0, 0, 0, 0, 0, 0, 0}),
       "not a decimal integer"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.name);
    auto rejected = server.stats().rejected;
    RawSocket bad(server.port());
    bad.send(c.wire);
    CHECK(bad.closed_by_peer());
    CHECK(server.stats().rejected == rejected + 1);
    CHECK(log_mentions(server, c.reason));
    CHECK(good.get("text") == "not a number");  // everyone else carries on
  }
  CHECK(eventually([&] { return server.stats().connections == 1; }));
}

TEST_CASE("a port in use is a StoreError naming host:port") {
  TestServer server;
  boost::asio::io_context io;
  ServerOptions options;
  options.host = "127.0.0.1";
  options.port = server.port();
  try {
    Server second(io, options);
    FAIL("bound a port that is in use");
  } catch (const StoreError& e) {
    CHECK_THAT(e.what(), Catch::Contains("127.0.0.1:" + std::to_string(server.port())));
    CHECK_THAT(e.what(), Catch::Contains("pick another port"));
  }
}

TEST_CASE("a client with no server fails after its connect timeout, naming the endpoint") {
  std::uint16_t port = 0;
  {
    TestServer server;
    port = server.port();
  }
  ClientOptions options;
  options.port = port;
  options.connect_timeout = 200ms;
  try {
    Client client(options);
    FAIL("connected to a closed port");
  } catch (const StoreError& e) {
    CHECK_THAT(e.what(), Catch::Contains("127.0.0.1:" + std::to_string(port)));
    CHECK_THAT(e.what(), Catch::Contains("connect"));
  }
}

TEST_CASE("detect_dialect: our server answers the 1.x probe") {
  TestServer server;
  CHECK(detect_dialect("127.0.0.1", server.port()) == Dialect::V1);
  ClientOptions options = server.client_options();
  options.dialect = std::nullopt;
  Client client(options);
  CHECK(client.dialect() == Dialect::V1);
  client.set("a", "b");
  CHECK(client.get("a") == "b");
}

TEST_CASE("detect_dialect: a server that does not answer the 1.x probe is taken for 2.x") {
  ddp::test::SilentListener silent;  // as a 2.x server waiting for the rest of a WAIT
  CHECK(detect_dialect("127.0.0.1", silent.port(), 100ms) == Dialect::V2);
}

TEST_CASE("raw: GET and MULTI_GET of a missing key answer an empty value, as PyTorch's server") {
  TestServer server;
  RawSocket s(server.port());
  s.send(bytes({0x00, 0xCE, 0xF7, 0x85, 0x3C}));
  s.send(bytes({0x03, 1, 0, 0, 0, 0, 0, 0, 0, 'm'}));  // GET "m"
  CHECK(s.read(8) == bytes({0, 0, 0, 0, 0, 0, 0, 0}));
  s.send(bytes(
      {0x0a, 2, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 'a', 1, 0, 0, 0, 0, 0, 0, 0, 'b'}));
  CHECK(s.read(16) == std::string(16, '\0'));
  CHECK(server.stats().rejected == 0);
}

TEST_CASE("an APPEND that would grow a value past the value limit closes its connection") {
  Limits limits;
  limits.max_value_bytes = 1000;
  TestServer server(limits);
  Client client(server.client_options());
  client.append("log", std::string(600, 'a'));
  CHECK(client.get("log").size() == 600);
  client.append("log", std::string(600, 'b'));     // APPEND has no reply
  CHECK_THROWS_AS(client.num_keys(), StoreError);  // the next call finds the connection closed
  CHECK(eventually([&] { return server.stats().rejected == 1; }));
  CHECK(log_mentions(server, "APPEND"));
  Client other(server.client_options());
  CHECK(other.get("log") == std::string(600, 'a'));
}

TEST_CASE("client and server: ADD past INT64_MAX wraps to INT64_MIN in both dialects") {
  for (Dialect dialect : {Dialect::V1, Dialect::V2}) {
    CAPTURE(dialect_name(dialect));
    TestServer server;
    Client client(server.client_options(dialect));
    constexpr auto kMax = std::numeric_limits<std::int64_t>::max();
    constexpr auto kMin = std::numeric_limits<std::int64_t>::min();
    CHECK(client.add("n", kMax) == kMax);
    CHECK(client.add("n", 1) == kMin);
    CHECK(client.get("n") == std::to_string(kMin));
    CHECK(client.add("n", -1) == kMax);
    CHECK(server.stats().rejected == 0);
  }
}

TEST_CASE("ADD reads the stored value as PyTorch's server does (std::stoll), in both dialects") {
  for (Dialect dialect : {Dialect::V1, Dialect::V2}) {
    TestServer server;
    std::int64_t closed = 0;
    for (const auto& form : ddp::test::add_forms()) {
      CAPTURE(dialect_name(dialect), form.stored);
      Client client(server.client_options(dialect));
      client.set("n", form.stored);
      if (form.after) {
        CHECK(client.add("n", 1) == *form.after);
        CHECK(client.get("n") == std::to_string(*form.after));
      } else {
        CHECK_THROWS_AS(client.add("n", 1), StoreError);  // the server closed the connection
        ++closed;
        Client other(server.client_options(dialect));
        CHECK(other.get("n") == form.stored);  // nothing changed
      }
    }
    CHECK(eventually([&] { return server.stats().rejected == closed; }));
    CHECK(log_mentions(server, "ADD"));
  }
}

TEST_CASE(
    "a server that accepts but never answers the 2.x handshake fails the client within its connect "
    "timeout") {
  ddp::test::SilentListener silent;  // the kernel accepts the connection, no one reads
  ClientOptions options;
  options.port = silent.port();
  options.connect_timeout = 200ms;
  options.timeout = 20s;  // for later calls: not the connect's bound
  try {
    Client client(options);
    FAIL("connected to a server that never answered");
  } catch (const StoreError& e) {
    CHECK_THAT(e.what(), Catch::Contains("127.0.0.1:" + std::to_string(options.port)));
    CHECK_THAT(e.what(), Catch::Contains("connect"));
    CHECK_THAT(e.what(), !Catch::Contains("20000 ms"));
  }
}
