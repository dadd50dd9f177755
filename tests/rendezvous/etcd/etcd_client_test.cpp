// ddp::etcd::Client against a real etcd cluster (tests/support/etcd_cluster.hpp): the v3
// calls, endpoint failover, lost quorum, TLS and auth.

#include <catch2/catch.hpp>
#include <chrono>
#include <optional>

#include "ddp/etcd/client.hpp"
#include "etcd_cluster.hpp"
#include "process_harness.hpp"
#include "skip.hpp"
#include "test_support.hpp"

using namespace std::chrono_literals;
using ddp::etcd::Client;
using ddp::etcd::ClientOptions;
using ddp::etcd::EtcdError;
using ddp::etcd::WatchEvent;
using ddp::test::EtcdCluster;
using ddp::test::EtcdClusterOptions;
using Clock = std::chrono::steady_clock;

namespace {

ClientOptions options_for(const std::string& endpoints) {
  ClientOptions options;
  options.endpoints = ddp::etcd::parse_endpoints(endpoints);
  options.connect_timeout = ddp::test::build_timeout(1s);
  options.request_timeout = ddp::test::build_timeout(3s);
  return options;
}

// A loopback port nobody listens on (connections are refused).
std::string dead_endpoint() {
  ddp::test::SilentListener listener;
  return "127.0.0.1:" + std::to_string(listener.port());
}

EtcdError::Kind kind_of(const std::function<void()>& call, std::string* message) {
  try {
    call();
  } catch (const EtcdError& e) {
    *message = e.what();
    return e.kind();
  }
  FAIL("no EtcdError thrown");
  return EtcdError::Kind::kProtocol;
}

}  // namespace

TEST_CASE("etcd client: parse_endpoints reads host:port lists and names a bad entry") {
  auto endpoints = ddp::etcd::parse_endpoints("127.0.0.1:2381, node2 ,[::1]:2390");
  REQUIRE(endpoints.size() == 3);
  CHECK(endpoints[0].host == "127.0.0.1");
  CHECK(endpoints[0].port == 2381);
  CHECK(endpoints[1].host == "node2");
  CHECK(endpoints[1].port == 2379);
  CHECK(endpoints[2].host == "::1");
  CHECK(endpoints[2].port == 2390);
  CHECK_THROWS_WITH(ddp::etcd::parse_endpoints("a:1,b:x"), Catch::Contains("'b:x'"));
  CHECK_THROWS_AS(ddp::etcd::parse_endpoints(""), std::invalid_argument);
}

TEST_CASE("etcd client: put, range one key or a prefix, remove") {
  if (!EtcdCluster::available()) return ddp::test::skip(EtcdCluster::kMissing);
  EtcdCluster cluster;
  Client client(options_for(cluster.endpoints()));
  CHECK(client.active_endpoint().empty());
  std::int64_t revision = client.put("/t/a", std::string("1\0x", 3));
  CHECK(revision > 0);
  client.put("/t/b", "2");
  client.put("/u", "3");

  auto one = client.range("/t/a");
  REQUIRE(one.kvs.size() == 1);
  CHECK(one.kvs[0].value == std::string("1\0x", 3));
  CHECK(one.kvs[0].mod_revision == revision);
  CHECK(one.revision >= revision);
  CHECK(client.range("/t/missing").kvs.empty());

  auto prefix = client.range("/t/", true, true);
  CHECK(prefix.count == 2);
  REQUIRE(prefix.kvs.size() == 2);
  CHECK(prefix.kvs[0].key == "/t/a");
  CHECK(prefix.kvs[1].key == "/t/b");
  CHECK(prefix.kvs[0].value.empty());  // keys_only

  CHECK(client.remove("/t/", true) == 2);
  CHECK(client.remove("/t/a") == 0);
  CHECK(client.range("/u").kvs.size() == 1);
  CHECK_FALSE(client.active_endpoint().empty());
}

TEST_CASE("etcd client: put_if holds only on the revision read and shows the key otherwise") {
  if (!EtcdCluster::available()) return ddp::test::skip(EtcdCluster::kMissing);
  EtcdCluster cluster(EtcdClusterOptions{.members = 1});
  Client client(options_for(cluster.endpoints()));
  auto created = client.put_if("k", "first", 0);
  CHECK(created.succeeded);
  auto again = client.put_if("k", "second", 0);  // must not exist: it does
  CHECK_FALSE(again.succeeded);
  REQUIRE(again.current);
  CHECK(again.current->value == "first");
  auto updated = client.put_if("k", "second", again.current->mod_revision);
  CHECK(updated.succeeded);
  auto stale = client.put_if("k", "third", again.current->mod_revision);
  CHECK_FALSE(stale.succeeded);
  REQUIRE(stale.current);
  CHECK(stale.current->value == "second");
  client.remove("k");
  auto gone = client.put_if("k", "x", stale.current->mod_revision);
  CHECK_FALSE(gone.succeeded);
  CHECK_FALSE(gone.current);
}

TEST_CASE("etcd client: a renewed lease keeps its key, an expired one makes it vanish") {
  if (!EtcdCluster::available()) return ddp::test::skip(EtcdCluster::kMissing);
  EtcdCluster cluster(EtcdClusterOptions{.members = 1});
  Client client(options_for(cluster.endpoints()));
  auto lease = client.grant_lease(1s);
  CHECK(lease.id != 0);
  CHECK(lease.ttl >= 1s);
  std::int64_t revision = client.put("node", "alive", lease.id);
  CHECK(client.range("node").kvs.at(0).lease == lease.id);
  client.keep_alive(lease.id);

  // Not renewed any more: etcd deletes the key when the lease expires.
  auto deadline = Clock::now() + lease.ttl + 5s;
  std::optional<WatchEvent> deleted;
  while (!deleted && Clock::now() < deadline) {
    for (const auto& event : client.watch("node", false, revision + 1, 1s)) {
      if (event.type == WatchEvent::Type::kDelete) deleted = event;
    }
  }
  REQUIRE(deleted);
  CHECK(deleted->kv.key == "node");
  CHECK(client.range("node").kvs.empty());
  std::string message;
  CHECK(kind_of([&] { client.keep_alive(lease.id); }, &message) == EtcdError::Kind::kLeaseExpired);
  CHECK_THAT(message, Catch::Contains(std::to_string(lease.id)));
  CHECK_NOTHROW(client.revoke(lease.id));  // already gone: no error
}

TEST_CASE("etcd client: watch sees puts and deletes from a revision, and times out empty") {
  if (!EtcdCluster::available()) return ddp::test::skip(EtcdCluster::kMissing);
  EtcdCluster cluster(EtcdClusterOptions{.members = 1});
  Client client(options_for(cluster.endpoints()));
  std::int64_t first = client.put("/w/a", "1");
  client.remove("/w/a");
  client.put("/other", "x");

  auto events = client.watch("/w/", true, first, 5s);
  REQUIRE(events.size() >= 1);
  CHECK(events[0].type == WatchEvent::Type::kPut);
  CHECK(events[0].kv.key == "/w/a");
  CHECK(events[0].kv.value == "1");
  if (events.size() == 1) {  // the delete came in a message of its own
    events = client.watch("/w/", true, events.back().kv.mod_revision + 1, 5s);
  }
  REQUIRE(!events.empty());
  CHECK(events.back().type == WatchEvent::Type::kDelete);
  CHECK(events.back().kv.key == "/w/a");

  std::int64_t now = client.range("/w/a").revision;
  auto start = Clock::now();
  CHECK(client.watch("/w/", true, now + 1, 300ms).empty());
  CHECK(Clock::now() - start >= 300ms);
  CHECK(Clock::now() - start < 3s);
  // The main connection still works after the watch's own one was closed.
  CHECK(client.range("/other").kvs.size() == 1);
}

TEST_CASE("etcd client: a dead first endpoint is skipped for the next") {
  if (!EtcdCluster::available()) return ddp::test::skip(EtcdCluster::kMissing);
  EtcdCluster cluster(EtcdClusterOptions{.members = 1});
  Client client(options_for(dead_endpoint() + "," + cluster.endpoint(0)));
  client.put("k", "v");
  CHECK(client.range("k").kvs.at(0).value == "v");
  CHECK(client.active_endpoint() == cluster.endpoint(0));
}

TEST_CASE("etcd client: no member up is kUnreachable naming every endpoint, in time") {
  std::string a = dead_endpoint();
  std::string b = dead_endpoint();
  Client client(options_for(a + "," + b));
  auto start = Clock::now();
  std::string message;
  CHECK(kind_of([&] { client.range("k"); }, &message) == EtcdError::Kind::kUnreachable);
  CHECK(Clock::now() - start < 2s);
  CHECK_THAT(message, Catch::Contains(a) && Catch::Contains(b) && Catch::Contains("unreachable"));

  // A member that accepts connections and never answers: bounded by request_timeout.
  ddp::test::SilentListener silent;
  ClientOptions options = options_for("127.0.0.1:" + std::to_string(silent.port()));
  options.request_timeout = 300ms;
  Client hanging(options);
  start = Clock::now();
  CHECK_THROWS_AS(hanging.range("k"), EtcdError);
  CHECK(Clock::now() - start < 2s);
}

TEST_CASE("etcd client: with one of three members killed, requests still succeed") {
  if (!EtcdCluster::available()) return ddp::test::skip(EtcdCluster::kMissing);
  EtcdCluster cluster;
  Client client(options_for(cluster.endpoints()));
  client.put("k", "1");
  REQUIRE(client.active_endpoint() == cluster.endpoint(0));
  cluster.kill_member(0);  // the member the client is connected to
  client.put("k", "2");
  CHECK(client.range("k").kvs.at(0).value == "2");
  CHECK(client.active_endpoint() != cluster.endpoint(0));
  cluster.restart_member(0);
  cluster.kill_member(1);
  CHECK(client.range("k").kvs.at(0).value == "2");
}

TEST_CASE("etcd client: requests ride out the election after the leader is killed") {
  if (!EtcdCluster::available()) return ddp::test::skip(EtcdCluster::kMissing);
  EtcdCluster cluster;
  Client client(options_for(cluster.endpoints()));
  client.put("k", "0");
  int leader = cluster.leader();
  REQUIRE(leader >= 0);
  cluster.kill_member(leader);
  for (int i = 1; i <= 10; ++i) {
    client.put("k", std::to_string(i));
    CHECK(client.range("k").kvs.at(0).value == std::to_string(i));
  }
  CHECK(client.active_endpoint() != cluster.endpoint(leader));
  CHECK(cluster.leader() >= 0);
}

TEST_CASE("etcd client: with two of three members killed, etcd has lost its quorum") {
  if (!EtcdCluster::available()) return ddp::test::skip(EtcdCluster::kMissing);
  EtcdCluster cluster;
  ClientOptions options = options_for(cluster.endpoints());
  options.request_timeout = 1s;
  Client client(options);
  client.put("k", "1");
  cluster.kill_member(1);
  cluster.kill_member(2);
  auto start = Clock::now();
  std::string message;
  auto kind = kind_of([&] { client.put("k", "2"); }, &message);
  CHECK(Clock::now() - start < 5s);
  INFO(message);
  CHECK((kind == EtcdError::Kind::kNoQuorum || kind == EtcdError::Kind::kUnreachable));
  if (kind == EtcdError::Kind::kNoQuorum) {
    CHECK_THAT(message, Catch::Contains("lost its quorum"));
  }
  CHECK_THAT(message, Catch::Contains(cluster.endpoint(1)) && Catch::Contains(cluster.endpoint(2)));

  // Once the survivor knows it has no leader, it says so at once.
  start = Clock::now();
  kind = kind_of([&] { client.range("k"); }, &message);
  CHECK(kind == EtcdError::Kind::kNoQuorum);
  CHECK_THAT(message, Catch::Contains("lost its quorum"));
  CHECK(Clock::now() - start < 5s);
}

TEST_CASE("etcd client: TLS with the cluster's CA and a client certificate") {
  if (!EtcdCluster::available()) return ddp::test::skip(EtcdCluster::kMissing);
  EtcdCluster cluster(EtcdClusterOptions{.members = 1, .tls = true});
  const auto& files = cluster.tls_files();
  ClientOptions options = options_for(cluster.endpoints());
  options.tls = true;
  options.cacert = files.ca;
  options.cert = files.client_cert;
  options.key = files.client_key;
  {
    Client client(options);
    client.put("k", "v");
    CHECK(client.range("k").kvs.at(0).value == "v");
    auto lease = client.grant_lease(5s);
    client.keep_alive(lease.id);
    std::int64_t revision = client.put("w", "1");
    CHECK(client.watch("w", false, revision, 2s).size() == 1);
  }
  SECTION("a host name is checked against the certificate's DNS names") {
    options.endpoints =
        ddp::etcd::parse_endpoints("localhost:" + std::to_string(options.endpoints.at(0).port));
    Client client(options);
    CHECK(client.range("k").kvs.at(0).value == "v");
  }
  SECTION("a CA that did not sign the member's certificate is refused, naming the file") {
    options.cacert = files.other_ca;
    Client client(options);
    std::string message;
    CHECK(kind_of([&] { client.range("k"); }, &message) == EtcdError::Kind::kRefused);
    CHECK_THAT(message, Catch::Contains("certificate verification failed") &&
                            Catch::Contains(files.other_ca.string()));
  }
  SECTION("without a client certificate the member refuses") {
    options.cert.clear();
    options.key.clear();
    Client client(options);
    std::string message;
    CHECK(kind_of([&] { client.range("k"); }, &message) == EtcdError::Kind::kRefused);
    CHECK_THAT(message, Catch::Contains("TLS"));
  }
  SECTION("plain HTTP to a TLS-only member is a clear error") {
    options.tls = false;
    Client client(options);
    std::string message;
    auto kind = kind_of([&] { client.range("k"); }, &message);
    INFO(message);
    CHECK(kind != EtcdError::Kind::kProtocol);
    CHECK_THAT(message, Catch::Contains("protocol=https"));
  }
  SECTION("an unreadable certificate file is named at once") {
    options.cacert = (cluster.dir() / "missing.pem").string();
    CHECK_THROWS_WITH(Client(options), Catch::Contains("missing.pem"));
  }
}

TEST_CASE("etcd client: user and password auth") {
  if (!EtcdCluster::available()) return ddp::test::skip(EtcdCluster::kMissing);
  EtcdCluster cluster(EtcdClusterOptions{.members = 1});
  std::string etcdctl_endpoints = "--endpoints=" + cluster.endpoints();
  for (std::vector<std::string> args : {std::vector<std::string>{"user", "add", "root:rootpw"},
                                        std::vector<std::string>{"auth", "enable"}}) {
    std::vector<std::string> argv = {"/usr/bin/etcdctl", etcdctl_endpoints};
    argv.insert(argv.end(), args.begin(), args.end());
    auto result = ddp::test::run_process(argv, {{"ETCDCTL_API", "3"}});
    REQUIRE(result.status == 0);
  }
  ClientOptions options = options_for(cluster.endpoints());
  options.user = "root";
  options.password = "rootpw";
  {
    Client client(options);
    client.put("k", "v");
    CHECK(client.range("k").kvs.at(0).value == "v");
  }
  options.password = "wrong";
  Client client(options);
  std::string message;
  CHECK(kind_of([&] { client.range("k"); }, &message) == EtcdError::Kind::kRefused);
  CHECK_THAT(message, Catch::Contains("password"));
  options.user.clear();
  Client anonymous(options);
  CHECK(kind_of([&] { anonymous.range("k"); }, &message) == EtcdError::Kind::kRefused);
  CHECK_THAT(message, Catch::Contains("user="));
}
