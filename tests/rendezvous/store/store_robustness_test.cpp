// The server under hostile or heavy use: many clients, stalled and garbage requests,
// absurd lengths, disconnects with waits pending. It stays up, serves everyone else, and
// its connections, waits and memory return to where they started.

#include <malloc.h>

#include <cstddef>

#if defined(__SANITIZE_ADDRESS__)
#define DDP_TEST_UNDER_ASAN 1
// From ASan's runtime (sanitizer/allocator_interface.h, which GCC does not install).
extern "C" std::size_t __sanitizer_get_current_allocated_bytes();
#else
#define DDP_TEST_UNDER_ASAN 0
#endif

#include <catch2/catch.hpp>
#include <random>

#include "ddp/store/client.hpp"
#include "ddp/store/wire_codec.hpp"
#include "raw_socket.hpp"
#include "store_fixture.hpp"

using namespace ddp::store;
using namespace std::chrono_literals;
using ddp::test::eventually;
using ddp::test::RawSocket;
using ddp::test::TestServer;

namespace {

const std::string kOpening = std::string("\x00\xCE\xF7\x85\x3C", 5);

std::string encode(Dialect dialect, const Request& request) {
  std::string out;
  encode_request(dialect, request, out);
  return out;
}

std::string v2(const Request& request) { return encode(Dialect::V2, request); }

std::string u64le(std::uint64_t v) {
  std::string out;
  put_u64(out, v);
  return out;
}

bool idle(const TestServer& server) {
  auto s = server.stats();
  return s.connections == 0 && s.waits == 0;
}

// Bytes the allocator has handed out and not taken back. glibc's mallinfo2 reads 0 under
// AddressSanitizer, which replaces malloc: there ASan's own count is used.
std::size_t allocated_bytes() {
#if DDP_TEST_UNDER_ASAN
  return __sanitizer_get_current_allocated_bytes();
#else
  return mallinfo2().uordblks;
#endif
}

// The same, counting large (mmap'ed) blocks too, such as a big output buffer (ASan's count
// includes them already).
std::size_t allocated_with_mmapped_bytes() {
#if DDP_TEST_UNDER_ASAN
  return __sanitizer_get_current_allocated_bytes();
#else
  auto info = mallinfo2();
  return info.uordblks + info.hblkhd;
#endif
}

}  // namespace

TEST_CASE("1,000 concurrent clients wait together and are all answered") {
  TestServer server;
  constexpr int kClients = 1000;
  std::vector<RawSocket> clients;
  clients.reserve(kClients);
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back(server.port());
    std::string key = "rank/" + std::to_string(i);
    REQUIRE(clients.back().send(kOpening + v2(make_request(Command::Set, {key}, {key})) +
                                v2(make_request(Command::Wait, {"go"}))));
  }
  REQUIRE(eventually([&] { return server.stats().waits == kClients; }));
  CHECK(server.stats().connections == kClients);
  Client starter(server.client_options());
  starter.set("go", "1");
  int answered = 0;
  for (int i = 0; i < kClients; ++i) {
    if (clients[i].read(1) == std::string(1, '\0')) ++answered;
  }
  CHECK(answered == kClients);
  CHECK(starter.num_keys() == kClients + 1);
  clients.clear();
  CHECK(eventually([&] { return server.stats().connections == 1; }));
}

TEST_CASE("a client stalled halfway through a request does not hold up the others") {
  TestServer server;
  RawSocket staller(server.port());
  const std::string request = kOpening + v2(make_request(Command::Set, {"stalled"}, {"value"}));
  const std::size_t half = kOpening.size() + 6;
  REQUIRE(staller.send(request.substr(0, half)));  // in the middle of the key's length

  Client client(server.client_options());
  for (int i = 0; i < 200; ++i) client.add("busy", 1);
  CHECK(client.get("busy") == "200");
  CHECK_FALSE(client.check({"stalled"}));

  REQUIRE(staller.send(request.substr(half) + v2(make_request(Command::Get, {"stalled"}))));
  CHECK(staller.read(8 + 5) == u64le(5) + "value");
}

TEST_CASE("random garbage and truncated requests close only their connections") {
  TestServer server;
  Client client(server.client_options());
  client.set("alive", "yes");
  std::mt19937_64 rng(42);
  for (int i = 0; i < 300; ++i) {
    RawSocket s(server.port());
    std::string junk(rng() % 300, '\0');
    for (auto& c : junk) c = static_cast<char>(rng());
    if (i % 2 == 0 && !junk.empty()) junk[0] = static_cast<char>(rng() % 17);
    if (i % 5 == 0) junk = kOpening + junk;
    s.send(junk);
    // Truncated: close with whatever was half sent.
  }
  CHECK(client.get("alive") == "yes");
  CHECK(eventually([&] { return server.stats().connections == 1 && server.stats().waits == 0; }));
}

TEST_CASE("lengths of 2^63 are rejected without allocating") {
  TestServer server;
  const std::uint64_t huge = 1ULL << 63;
  const std::vector<std::string> requests = {
      std::string(1, '\x02') + u64le(huge),                              // 1.x GET key length
      std::string(1, '\x00') + u64le(1) + "k" + u64le(huge),             // 1.x SET value length
      std::string(1, '\x05') + u64le(huge),                              // 1.x WAIT key count
      kOpening + std::string(1, '\x0b') + u64le(huge),                   // 2.x MULTI_SET count
      kOpening + std::string(1, '\x09') + u64le(1) + "k" + u64le(huge),  // 2.x APPEND length
      kOpening + std::string(1, '\x02') + u64le(1) + "k" + u64le(0) + u64le(~0ULL),  // COMPARE_SET
  };
  auto before = allocated_bytes();
  REQUIRE(before > 0);  // the measure works in this build
  for (const auto& wire : requests) {
    RawSocket s(server.port());
    s.send(wire);
    CHECK(s.closed_by_peer());
  }
  CHECK(server.stats().rejected == static_cast<std::int64_t>(requests.size()));
  CHECK(eventually([&] { return idle(server); }));
  CHECK(allocated_bytes() < before + 1024 * 1024);
  Client client(server.client_options());
  client.set("still", "up");
  CHECK(client.get("still") == "up");
}

TEST_CASE("thousands of disconnects with waits pending leave nothing behind") {
  TestServer server;
  auto churn = [&](int rounds) {
    for (int round = 0; round < rounds; ++round) {
      std::vector<RawSocket> batch;
      for (int i = 0; i < 100; ++i) {
        batch.emplace_back(server.port());
        std::string unique =
            "missing/" + std::to_string(round) + "/" + std::to_string(i) + std::string(100, 'x');
        bool v1 = i % 2 == 1;
        Request wait = make_request(Command::Wait, {unique, "shared-missing", unique});
        batch.back().send(v1 ? encode(Dialect::V1, wait) : kOpening + v2(wait));
      }
      REQUIRE(eventually([&] { return server.stats().waits == 100; }));
      batch.clear();  // every client disconnects with its wait pending
      REQUIRE(eventually([&] { return idle(server); }));
    }
  };
  churn(5);  // warm up the allocator and the server's tables
  auto before = allocated_bytes();
  REQUIRE(before > 0);  // the measure works in this build
  churn(30);
  CHECK(server.stats().accepted == 3500);
  CHECK(idle(server));
  // Leaked waits would hold > 100 bytes each: 3,000 of them at least 300 KB.
  CHECK(allocated_bytes() <= before + 64 * 1024);
  Client client(server.client_options());
  client.set("shared-missing", "now");
  CHECK(client.num_keys() == 1);
}

TEST_CASE("a client that sends faster than it reads is paused, then served in full") {
  TestServer server;
  Client client(server.client_options());
  const std::string big(1024 * 1024, 'b');
  client.set("big", big);
  REQUIRE(client.get("big") == big);  // stored before the raw GETs arrive
  RawSocket greedy(server.port());
  constexpr int kGets = 80;  // 80 MiB of replies, more than the server queues for one client
  std::string requests;
  for (int i = 0; i < kGets; ++i)
    requests += encode(Dialect::V1, make_request(Command::Get, {"big"}));
  REQUIRE(greedy.send(requests));
  client.set("others", "still served");  // while the greedy client reads nothing
  CHECK(client.get("others") == "still served");
  std::size_t complete = 0;
  for (int i = 0; i < kGets; ++i) {
    auto got = greedy.read(8 + big.size());
    if (got == u64le(big.size()) + big) {
      ++complete;
    } else {
      WARN("reply " << i << ": " << got.size() << " bytes");
      break;
    }
  }
  CHECK(complete == kGets);
}

TEST_CASE("a burst of small requests for large replies is answered a bounded amount at a time") {
  TestServer server;
  Client client(server.client_options());
  const std::string big(1024 * 1024, 'b');
  client.set("big", big);
  REQUIRE(client.get("big") == big);
  RawSocket greedy(server.port());
  constexpr int kGets = 120;  // 120 MiB of replies asked for in one ~1.5 KB burst
  std::string requests;
  for (int i = 0; i < kGets; ++i)
    requests += encode(Dialect::V1, make_request(Command::Get, {"big"}));
  const auto handled = server.stats().requests;
  const auto before = allocated_with_mmapped_bytes();
  REQUIRE(before > 0);  // the measure works in this build
  REQUIRE(greedy.send(requests));
  REQUIRE(eventually([&] { return server.stats().requests > handled + 8; }));
  // A round trip of another client: the loop has finished with the burst for now.
  CHECK(client.num_keys() == 1);
  // About 32 MiB queued (plus what the socket holds), not the whole 120 MiB.
  CHECK(allocated_with_mmapped_bytes() < before + 48 * 1024 * 1024);
  std::size_t complete = 0;
  for (int i = 0; i < kGets; ++i) {
    if (greedy.read(8 + big.size()) != u64le(big.size()) + big) break;
    ++complete;
  }
  CHECK(complete == kGets);
}

TEST_CASE("a MULTI_GET whose reply would exceed the limit closes its connection") {
  TestServer server;
  Client client(server.client_options());
  client.set("big", std::string(1024 * 1024, 'b'));
  REQUIRE(client.check({"big"}));
  RawSocket greedy(server.port());
  // 100 times the same 1 MiB value: a 100 MiB reply from a 1.7 KB request.
  std::vector<std::string> keys(100, "big");
  REQUIRE(greedy.send(kOpening + v2(make_request(Command::MultiGet, keys))));
  CHECK(greedy.closed_by_peer());
  CHECK(server.stats().rejected == 1);
  bool logged = false;
  for (const auto& line : server.log()) {
    logged = logged || (line.find("MULTI_GET") != std::string::npos &&
                        line.find("127.0.0.1:") != std::string::npos);
  }
  CHECK(logged);
  CHECK(client.multi_get({"big", "big"}).size() == 2);  // a modest one is still answered
}

TEST_CASE("a 1.x watcher that never reads its events is closed, not buffered without bound") {
  TestServer server;
  RawSocket watcher(server.port());
  REQUIRE(watcher.send(encode(Dialect::V1, make_request(Command::WatchKey, {"w"}))));
  REQUIRE(watcher.read(1) == std::string(1, '\x03'));
  REQUIRE(server.stats().connections == 1);  // the watch is registered
  Client setter(server.client_options(Dialect::V1));
  REQUIRE(setter.num_keys() == 0);  // accepted: two connections now
  const std::string value(1024 * 1024, 'v');
  // Each change pushes old and new value: about 2 MiB of events a SET, 100 MiB for 50.
  for (int i = 0; i < 50; ++i) setter.set("w", value);
  CHECK(eventually([&] { return server.stats().connections == 1; }));  // the setter alone
  CHECK(watcher.closed_by_peer());
  CHECK(setter.get("w") == value);
}

namespace {

// Far below the 20 s the server froze for when pending waits were removed by scanning.
constexpr auto kPromptly = 5s;
constexpr int kPipelinedWaits = 160000;

// A connection with kPipelinedWaits WAITs for one missing key, all registered.
RawSocket flood_with_waits(const TestServer& server) {
  RawSocket flood(server.port());
  const std::string wait = v2(make_request(Command::Wait, {"never"}));
  std::string bytes = kOpening;
  bytes.reserve(kOpening.size() + wait.size() * kPipelinedWaits);
  for (int i = 0; i < kPipelinedWaits; ++i) bytes += wait;
  REQUIRE(flood.send(bytes));
  REQUIRE(eventually([&] { return server.stats().waits == kPipelinedWaits; }, 60s));
  return flood;
}

}  // namespace

TEST_CASE(
    "160 thousand WAITs pipelined on one connection are dropped without stalling the others") {
  ServerOptions options;
  options.max_waits_per_connection = kPipelinedWaits;
  TestServer server(options);
  Client other(server.client_options());
  RawSocket flood = flood_with_waits(server);
  const auto start = std::chrono::steady_clock::now();
  SECTION("by closing the connection") {
    flood.close();
    CHECK(eventually([&] { return server.stats().waits == 0; }, kPromptly));
  }
  SECTION("by CANCEL_WAIT") {
    REQUIRE(flood.send(v2(make_request(Command::CancelWait))));
    CHECK(flood.read(1, kPromptly) == std::string(1, static_cast<char>(kWaitCanceled)));
  }
  SECTION("by SETting the key") {
    other.set("never", "now");
    CHECK(flood.read(kPipelinedWaits, kPromptly) ==
          std::string(kPipelinedWaits, static_cast<char>(kStopWaiting)));
  }
  other.ping();  // the server answers the others at once
  CHECK(std::chrono::steady_clock::now() - start < kPromptly);
  CHECK(eventually([&] { return server.stats().waits == 0; }));
}

TEST_CASE("one WAIT over the per-connection cap closes that connection only") {
  TestServer server;  // the default cap
  RawSocket flood(server.port());
  const std::string wait = v2(make_request(Command::Wait, {"never"}));
  std::string bytes = kOpening;
  for (std::size_t i = 0; i < kDefaultMaxWaitsPerConnection; ++i) bytes += wait;
  REQUIRE(flood.send(bytes));
  REQUIRE(eventually([&] {
    return server.stats().waits == static_cast<std::int64_t>(kDefaultMaxWaitsPerConnection);
  }));
  CHECK(server.stats().rejected == 0);
  flood.send(wait);
  CHECK(flood.closed_by_peer());
  CHECK(eventually([&] { return idle(server); }));
  CHECK(server.stats().rejected == 1);
  bool logged = false;
  for (const auto& line : server.log()) {
    logged = logged || line.find("WAITs pending on one connection") != std::string::npos;
  }
  CHECK(logged);
  Client client(server.client_options());
  client.set("never", "now");
  client.wait({"never"});
}

namespace {

bool log_has(const TestServer& server, const std::string& text) {
  for (const auto& line : server.log()) {
    if (line.find(text) != std::string::npos) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("a SET past the store-wide budget closes that connection and stores nothing") {
  ServerOptions options;
  options.max_stored_bytes = 1024 * 1024;
  TestServer server(options);
  const std::string value(100 * 1024, 'v');
  Client filler(server.client_options());
  for (int i = 0; i < 10; ++i) filler.set("k" + std::to_string(i), value);  // 1,000 KiB
  CHECK(filler.num_keys() == 10);
  CHECK(server.stats().stored_bytes == 10 * (2 + 100 * 1024));
  filler.set("k10", value);  // SET has no reply: the next call finds the connection closed
  CHECK_THROWS_AS(filler.num_keys(), StoreError);
  CHECK(eventually([&] { return server.stats().rejected == 1; }));
  CHECK(log_has(server, "--max-stored-bytes"));
  Client other(server.client_options());
  CHECK(other.num_keys() == 10);
  CHECK_FALSE(other.check({"k10"}));
  CHECK(other.get("k0") == value);
  other.set("k0", "small");  // replacing a value with a smaller one always fits
  other.set("k10", value);   // and frees room for another
  CHECK(other.get("k10") == value);
  // The other ways to store count too.
  for (auto command : {Command::Append, Command::QueuePush}) {
    CAPTURE(command_name(command));
    RawSocket raw(server.port());
    raw.send(kOpening + v2(make_request(command, {"grow"}, {value})));
    CHECK(raw.closed_by_peer());
  }
  CHECK(eventually([&] { return server.stats().rejected == 3; }));
}

TEST_CASE("replies queued past the store-wide budget close the client that does not read them") {
  ServerOptions options;
  options.max_queued_reply_bytes = 4 * 1024 * 1024;
  TestServer server(options);
  Client client(server.client_options());
  const std::string big(1024 * 1024, 'b');
  client.set("big", big);
  REQUIRE(client.get("big") == big);
  RawSocket greedy(server.port());
  // 40 MiB of replies, never read: more than the socket buffers and the budget together.
  std::string requests;
  for (int i = 0; i < 40; ++i) requests += encode(Dialect::V1, make_request(Command::Get, {"big"}));
  REQUIRE(greedy.send(requests));
  CHECK(eventually([&] { return server.stats().rejected == 1; }));
  CHECK(log_has(server, "--max-queued-reply-bytes"));
  CHECK(eventually([&] { return server.stats().queued_reply_bytes == 0; }));
  CHECK(client.get("big") == big);  // the others go on
}
