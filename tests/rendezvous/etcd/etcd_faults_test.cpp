// etcd's answers lost or garbled between a real member and the client (tests/support's
// FaultProxy in front of tests/support's EtcdCluster): every write still applies exactly
// once, an answer the client cannot read is a typed EtcdError (never another exception), and
// the rendezvous engine rides both out.

#include <catch2/catch.hpp>
#include <exception>
#include <mutex>
#include <thread>

#include "ddp/etcd/etcd_store.hpp"
#include "etcd_cluster.hpp"
#include "fault_proxy.hpp"
#include "rendezvous_harness.hpp"
#include "skip.hpp"
#include "store_fixture.hpp"
#include "test_support.hpp"

using namespace std::chrono_literals;
using ddp::etcd::ClientOptions;
using ddp::etcd::EtcdError;
using ddp::etcd::EtcdStore;
using ddp::test::EtcdCluster;
using ddp::test::EtcdClusterOptions;
using ddp::test::Fault;
using ddp::test::FaultProxy;

namespace {

constexpr const char* kPrefix = "/ddprun/faults/";

ClientOptions options_at(const std::string& endpoints) {
  ClientOptions options;
  options.endpoints = ddp::etcd::parse_endpoints(endpoints);
  options.request_timeout = ddp::test::build_timeout(5s);
  return options;
}

EtcdStore store_at(const std::string& endpoints) {
  return EtcdStore(options_at(endpoints), kPrefix, ddp::test::build_timeout(10s));
}

// How many times etcd changed the key (its version): 0 when it does not exist.
std::int64_t version_of(EtcdStore& store, const std::string& key) {
  auto read = store.client().range(kPrefix + key);
  return read.kvs.empty() ? 0 : read.kvs.front().version;
}

}  // namespace

TEST_CASE("etcd faults: an add whose answer is lost after it applied applies exactly once") {
  if (!EtcdCluster::available()) return ddp::test::skip(EtcdCluster::kMissing);
  EtcdCluster cluster(EtcdClusterOptions{.members = 1});
  FaultProxy proxy(cluster.endpoint(0));
  EtcdStore store = store_at(proxy.endpoint());
  EtcdStore direct = store_at(cluster.endpoints());
  CHECK(store.add("n", 1) == 1);
  for (int i = 2; i <= 4; ++i) {
    proxy.arm(Fault::kDropAfterForward, "/v3/kv/txn");
    CHECK(store.add("n", 1) == i);
    CHECK(proxy.armed() == 0);  // the fault did happen
    CHECK(direct.get("n") == std::to_string(i));
  }
  CHECK(version_of(direct, "n") == 4);
}

TEST_CASE("etcd faults: two clients adding at once with answers lost count every add once") {
  if (!EtcdCluster::available()) return ddp::test::skip(EtcdCluster::kMissing);
  EtcdCluster cluster(EtcdClusterOptions{.members = 1});
  constexpr int kAdds = 15;
  FaultProxy proxy_a(cluster.endpoint(0));
  FaultProxy proxy_b(cluster.endpoint(0));
  // Every third transaction of each client applies and loses its answer.
  for (auto* proxy : {&proxy_a, &proxy_b}) {
    for (int i = 0; i < kAdds; i += 3) proxy->arm(Fault::kDropAfterForward, "/v3/kv/txn", 1, 2);
  }
  EtcdStore a = store_at(proxy_a.endpoint());
  EtcdStore b = store_at(proxy_b.endpoint());
  std::exception_ptr failure;
  std::thread other([&] {
    try {
      for (int i = 0; i < kAdds; ++i) b.add("n", 1);
    } catch (...) {
      failure = std::current_exception();
    }
  });
  std::string mine;
  try {
    for (int i = 0; i < kAdds; ++i) a.add("n", 1);
  } catch (const std::exception& e) {
    mine = e.what();
  }
  other.join();
  CHECK(mine == "");
  if (failure) std::rethrow_exception(failure);
  EtcdStore direct = store_at(cluster.endpoints());
  CHECK(direct.get("n") == std::to_string(2 * kAdds));
  CHECK(proxy_a.armed() + proxy_b.armed() < 2 * ((kAdds + 2) / 3));  // faults did happen
}

TEST_CASE(
    "etcd faults: set, compare_set, append and delete_key apply once when the answer is "
    "lost") {
  if (!EtcdCluster::available()) return ddp::test::skip(EtcdCluster::kMissing);
  EtcdCluster cluster(EtcdClusterOptions{.members = 1});
  FaultProxy proxy(cluster.endpoint(0));
  EtcdStore store = store_at(proxy.endpoint());
  EtcdStore direct = store_at(cluster.endpoints());

  proxy.arm(Fault::kDropAfterForward, "/v3/kv/txn");
  store.set("s", "v");
  CHECK(direct.get("s") == "v");
  CHECK(version_of(direct, "s") == 1);

  direct.set("c", "a");
  proxy.arm(Fault::kDropAfterForward, "/v3/kv/txn");
  CHECK(store.compare_set("c", "a", "b") == "b");
  CHECK(direct.get("c") == "b");
  CHECK(version_of(direct, "c") == 2);

  direct.set("log", "a");
  proxy.arm(Fault::kDropAfterForward, "/v3/kv/txn");
  store.append("log", "x");
  CHECK(direct.get("log") == "ax");

  proxy.arm(Fault::kDropAfterForward, "/v3/kv/txn");
  CHECK(store.delete_key("log"));  // it was there: the marker kept the outcome
  CHECK_FALSE(direct.check({"log"}));
  proxy.arm(Fault::kDropAfterForward, "/v3/kv/txn");
  CHECK_FALSE(store.delete_key("log"));
  CHECK(proxy.armed() == 0);
  // The client's marker lives beside the prefix: the store's keys are only its own.
  CHECK(direct.num_keys() == 2);
}

TEST_CASE(
    "etcd faults: a garbled answer to a write is settled, garbled answers only are a "
    "typed kProtocol error") {
  if (!EtcdCluster::available()) return ddp::test::skip(EtcdCluster::kMissing);
  EtcdCluster cluster(EtcdClusterOptions{.members = 1});
  FaultProxy proxy(cluster.endpoint(0));
  EtcdStore store = store_at(proxy.endpoint());
  EtcdStore direct = store_at(cluster.endpoints());

  proxy.arm(Fault::kGarbage, "/v3/kv/txn");  // the add applies, its answer is not JSON
  CHECK(store.add("n", 5) == 5);
  CHECK(direct.get("n") == "5");

  proxy.arm(Fault::kGarbage, "/v3/kv/txn", 1000);
  try {
    store.add("n", 1);
    FAIL("an add whose every answer is garbage succeeded");
  } catch (const EtcdError& e) {
    CHECK(e.kind() == EtcdError::Kind::kProtocol);
    CHECK_THAT(e.what(), Catch::Contains("not etcd's JSON"));
  }
  CHECK(direct.get("n") == "6");  // the first copy reached etcd; none after it applied
}

TEST_CASE("etcd faults: a malformed etcd answer is a clear EtcdError, never a JSON exception") {
  if (!EtcdCluster::available()) return ddp::test::skip(EtcdCluster::kMissing);
  EtcdCluster cluster(EtcdClusterOptions{.members = 1});
  FaultProxy proxy(cluster.endpoint(0));
  EtcdStore store = store_at(proxy.endpoint());
  store.set("k", "v");
  for (const char* target : {"/v3/kv/range", "/v3/kv/txn", "/v3/lease/grant"}) {
    INFO(target);
    proxy.arm(Fault::kMalformedJson, target, 1000);
    try {
      if (std::string(target) == "/v3/kv/range") store.check({"k"});
      if (std::string(target) == "/v3/kv/txn") store.set("k", "w");
      if (std::string(target) == "/v3/lease/grant") store.client().grant_lease(5s);
      FAIL("a malformed answer was accepted");
    } catch (const EtcdError& e) {
      CHECK(e.kind() == EtcdError::Kind::kProtocol);
      CHECK_THAT(e.what(), Catch::Contains("cannot read"));
    }
    proxy.disarm();
  }
}

TEST_CASE(
    "etcd faults: a rendezvous through malformed answers fails with a clear error, and "
    "its heartbeat thread does not end the process") {
  if (!EtcdCluster::available()) return ddp::test::skip(EtcdCluster::kMissing);
  EtcdCluster cluster(EtcdClusterOptions{.members = 1});
  FaultProxy proxy(cluster.endpoint(0));
  proxy.arm(Fault::kMalformedJson, "", 1 << 30);
  ddp::test::Inbox inbox;
  ddp::test::Job job{"etcd", "job", 1, 1};
  job.join = 2s;
  auto settings = ddp::test::settings_for(0, job, "a");
  settings.etcd.endpoints = proxy.endpoint();
  ddp::test::Node a(inbox, settings);
  a.next_round();
  auto error = inbox.take("a", ddp::test::Event::Kind::kError);
  REQUIRE(error);
  CHECK_THAT(error->error, Catch::Contains("cannot read"));
  // The heartbeat thread met the same answers meanwhile (lease grants) and is still there.
  CHECK(ddp::test::eventually([&] { return proxy.forwarded() > 5; }));
}
