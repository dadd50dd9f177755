// ddp::etcd::EtcdStore against a real etcd (tests/support/etcd_cluster.hpp): the c10d store
// semantics that memory_store_test.cpp checks for MemoryStore, plus watches and leases.

#include "ddp/etcd/etcd_store.hpp"

#include <catch2/catch.hpp>
#include <exception>
#include <limits>
#include <set>
#include <thread>

#include "etcd_cluster.hpp"
#include "skip.hpp"
#include "test_support.hpp"

using namespace std::chrono_literals;
using ddp::etcd::ClientOptions;
using ddp::etcd::EtcdStore;
using ddp::store::StoreError;
using ddp::store::StoreTimeout;
using ddp::test::EtcdCluster;
using ddp::test::EtcdClusterOptions;
using Clock = std::chrono::steady_clock;

namespace {

ClientOptions options_for(const EtcdCluster& cluster) {
  ClientOptions options;
  options.endpoints = ddp::etcd::parse_endpoints(cluster.endpoints());
  options.request_timeout = ddp::test::build_timeout(5s);
  return options;
}

EtcdStore store_on(const EtcdCluster& cluster, std::chrono::milliseconds timeout = 10s) {
  return EtcdStore(options_for(cluster), "/ddprun/test/", ddp::test::build_timeout(timeout));
}

// Runs body on a thread of its own; join() rethrows what it threw, on the test's thread.
class Helper {
 public:
  template <class Body>
  explicit Helper(Body body)
      : thread_([this, body] {
          try {
            body();
          } catch (...) {
            error_ = std::current_exception();
          }
        }) {}
  ~Helper() {
    if (thread_.joinable()) thread_.join();
  }
  void join() {
    thread_.join();
    if (error_) std::rethrow_exception(error_);
  }

 private:
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace

TEST_CASE("etcd store: set, get, add as decimal text, delete, num_keys under the prefix") {
  if (!EtcdCluster::available()) return ddp::test::skip(EtcdCluster::kMissing);
  EtcdCluster cluster(EtcdClusterOptions{.members = 1});
  EtcdStore store = store_on(cluster);
  EtcdStore elsewhere(options_for(cluster), "/ddprun/other/", 1s);
  elsewhere.set("a", "outside");
  store.set("a", "1");
  CHECK(store.get("a") == "1");
  CHECK(store.add("n", 5) == 5);
  CHECK(store.add("n", -2) == 3);
  CHECK(store.get("n") == "3");
  store.set("text", "x");
  CHECK_THROWS_AS(store.add("text", 1), StoreError);
  CHECK(store.num_keys() == 3);
  CHECK(store.delete_key("a"));
  CHECK_FALSE(store.delete_key("a"));
  CHECK(elsewhere.get("a") == "outside");
  store.set("bytes", std::string("\0\xff\n", 3));
  CHECK(store.get("bytes") == std::string("\0\xff\n", 3));
}

TEST_CASE("etcd store: compare_set follows PyTorch's missing-key rules") {
  if (!EtcdCluster::available()) return ddp::test::skip(EtcdCluster::kMissing);
  EtcdCluster cluster(EtcdClusterOptions{.members = 1});
  EtcdStore store = store_on(cluster);
  CHECK(store.compare_set("k", "x", "y") == "x");  // missing, non-empty expected: no store
  CHECK_FALSE(store.check({"k"}));
  CHECK(store.compare_set("k", "", "y") == "y");   // missing, empty expected: store
  CHECK(store.compare_set("k", "y", "z") == "z");  // equal: replace
  CHECK(store.compare_set("k", "q", "w") == "z");  // different: current value
  CHECK(store.get("k") == "z");
}

TEST_CASE("etcd store: ADD past INT64_MAX wraps as the TCP store's server does") {
  if (!EtcdCluster::available()) return ddp::test::skip(EtcdCluster::kMissing);
  EtcdCluster cluster(EtcdClusterOptions{.members = 1});
  EtcdStore store = store_on(cluster);
  constexpr auto kMax = std::numeric_limits<std::int64_t>::max();
  CHECK(store.add("n", kMax) == kMax);
  CHECK(store.add("n", 1) == std::numeric_limits<std::int64_t>::min());
  CHECK(store.get("n") == std::to_string(std::numeric_limits<std::int64_t>::min()));
}

TEST_CASE("etcd store: append, check, multi_set and multi_get") {
  if (!EtcdCluster::available()) return ddp::test::skip(EtcdCluster::kMissing);
  EtcdCluster cluster(EtcdClusterOptions{.members = 1});
  EtcdStore store = store_on(cluster);
  store.append("log", "a");
  store.append("log", "bc");
  CHECK(store.get("log") == "abc");
  store.multi_set({"x", "y"}, {"1", "2"});
  CHECK(store.check({"x", "y", "log"}));
  CHECK_FALSE(store.check({"x", "z"}));
  CHECK(store.multi_get({"y", "x"}) == std::vector<std::string>{"2", "1"});
  CHECK_THROWS_AS(store.multi_set({"x"}, {}), StoreError);
}

TEST_CASE("etcd store: wait and get wake on a set by another client, and time out naming keys") {
  if (!EtcdCluster::available()) return ddp::test::skip(EtcdCluster::kMissing);
  EtcdCluster cluster;
  EtcdStore store = store_on(cluster);
  Helper setter([&] {
    EtcdStore other = store_on(cluster);
    other.wait({"go"});  // set by the test once it is waiting
    other.set("a", "1");
    other.set("b", "2");
  });
  store.set("go", "");
  auto start = Clock::now();
  store.wait({"a", "b"}, 10s);
  CHECK(Clock::now() - start < 5s);
  CHECK(store.get("b") == "2");
  setter.join();
  CHECK(store.multi_get({"a", "b"}) == std::vector<std::string>{"1", "2"});

  Helper late([&] {
    EtcdStore other = store_on(cluster);
    other.wait({"ready"});
    other.set("late", "here");
  });
  store.set("ready", "");
  CHECK(store.get("late") == "here");
  late.join();

  start = Clock::now();
  CHECK_THROWS_WITH(store.wait({"a", "missing"}, 300ms), Catch::Contains("'missing'"));
  CHECK(Clock::now() - start >= 300ms);
  store.set_timeout(200ms);
  CHECK_THROWS_AS(store.get("absent"), StoreTimeout);
  CHECK_THROWS_AS(store.multi_get({"a", "absent"}), StoreTimeout);
}

TEST_CASE("etcd store: add from two clients at once counts every increment") {
  if (!EtcdCluster::available()) return ddp::test::skip(EtcdCluster::kMissing);
  EtcdCluster cluster;
  constexpr int kEach = 40;
  std::vector<std::int64_t> seen[2];
  std::vector<std::unique_ptr<Helper>> adders;
  for (int t = 0; t < 2; ++t) {
    adders.push_back(std::make_unique<Helper>([&, t] {
      EtcdStore store = store_on(cluster);
      for (int i = 0; i < kEach; ++i) seen[t].push_back(store.add("counter", 1));
    }));
  }
  for (auto& adder : adders) adder->join();
  EtcdStore store = store_on(cluster);
  CHECK(store.get("counter") == std::to_string(2 * kEach));
  std::set<std::int64_t> all(seen[0].begin(), seen[0].end());
  all.insert(seen[1].begin(), seen[1].end());
  CHECK(all.size() == 2 * kEach);  // every add saw its own result
}

TEST_CASE("etcd store: keys with a lease vanish with it and wake_on_delete wakes a wait") {
  if (!EtcdCluster::available()) return ddp::test::skip(EtcdCluster::kMissing);
  EtcdCluster cluster(EtcdClusterOptions{.members = 1});
  EtcdStore node = store_on(cluster);
  auto lease = node.client().grant_lease(1s);
  node.set_with_lease("nodes/a", "1", lease.id);
  node.set("nodes/b", "2");
  node.set("other", "3");
  auto keys = node.keys_under("nodes/");
  CHECK(keys == std::vector<std::string>{"nodes/a", "nodes/b"});

  EtcdStore waiter = store_on(cluster);
  waiter.wake_on_delete("nodes/");
  auto start = Clock::now();
  // The lease is never renewed: etcd deletes nodes/a after about its TTL.
  CHECK_THROWS_AS(waiter.wait({"never"}, 20s), StoreTimeout);
  CHECK(Clock::now() - start < 10s);
  CHECK(waiter.keys_under("nodes/") == std::vector<std::string>{"nodes/b"});
  CHECK_FALSE(waiter.check({"nodes/a"}));
}

TEST_CASE("etcd store: a wait carries on when the member it uses is killed") {
  if (!EtcdCluster::available()) return ddp::test::skip(EtcdCluster::kMissing);
  EtcdCluster cluster;
  EtcdStore store = store_on(cluster);
  store.set("before", "1");
  REQUIRE(store.client().active_endpoint() == cluster.endpoint(0));
  // Kills member 0 while the test waits through it (or is about to), then sets the key
  // through the others.
  Helper killer([&] {
    cluster.kill_member(0);
    ClientOptions others = options_for(cluster);
    others.endpoints.erase(others.endpoints.begin());
    EtcdStore(others, "/ddprun/test/", 10s).set("k", "after");
  });
  CHECK(store.get("k") == "after");
  killer.join();
  CHECK(store.client().active_endpoint() != cluster.endpoint(0));
}

TEST_CASE("etcd store: a client's write marker goes with it, leaving no key behind") {
  if (!EtcdCluster::available()) return ddp::test::skip(EtcdCluster::kMissing);
  EtcdCluster cluster(EtcdClusterOptions{.members = 1});
  ddp::etcd::Client reader(options_for(cluster));
  {
    EtcdStore store = store_on(cluster);
    store.set("a", "1");  // a write: the marker exists now
    CHECK(reader.range("/ddprun/test.writes/", true, true).count == 1);
  }
  CHECK(reader.range("/ddprun/test.writes/", true, true).count == 0);
  CHECK(reader.range("/ddprun/test/a", false, true).count == 1);  // the data stays
}
