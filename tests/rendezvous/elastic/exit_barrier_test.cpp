// The exit barrier (finish_round) on the c10d and etcd backends: one key per node under
// round_<r>/done/, never a counter, so a node missing never lets it pass (not even with a
// stray key there), and a store error on the way is retried for the failure budget.

#include <catch2/catch.hpp>
#include <mutex>

#include "ddp/etcd/etcd_store.hpp"
#include "ddp/store/prefix_store.hpp"
#include "etcd_cluster.hpp"
#include "fault_proxy.hpp"
#include "rendezvous_harness.hpp"
#include "skip.hpp"
#include "store_fixture.hpp"

using namespace std::chrono_literals;
using namespace ddp::test;

namespace {

// A quiet stretch in which an event must not come: several barrier slices (200 ms).
constexpr auto kQuiet = 1500ms;

// The backend under test with a raw store on the run's keys, to look at and to meddle.
struct Backend {
  std::string name;
  std::unique_ptr<TestServer> server;
  std::unique_ptr<EtcdCluster> cluster;

  RendezvousSettings settings(const Job& job, const std::string& node) const {
    auto s = settings_for(server ? server->port() : 0, job, node);
    if (cluster) s.etcd.endpoints = cluster->endpoints();
    return s;
  }
  // A store whose keys are the run's (relative to /ddprun/job/).
  std::unique_ptr<ddp::store::Store> raw() const {
    if (cluster) {
      ddp::etcd::ClientOptions options;
      options.endpoints = ddp::etcd::parse_endpoints(cluster->endpoints());
      return std::make_unique<ddp::etcd::EtcdStore>(options, "/ddprun/job/", 5s);
    }
    return std::make_unique<ddp::store::PrefixStore>(
        "/ddprun/job", std::make_shared<ddp::store::Client>(server->client_options()));
  }
};

}  // namespace

TEST_CASE("exit barrier: with one member missing it does not pass, once all arrive it does") {
  std::string backend = GENERATE("c10d", "etcd");
  INFO(backend);
  Backend b{backend, nullptr, nullptr};
  if (backend == "etcd") {
    if (!EtcdCluster::available()) return ddp::test::skip(EtcdCluster::kMissing);
    b.cluster = std::make_unique<EtcdCluster>(EtcdClusterOptions{.members = 1});
  } else {
    b.server = std::make_unique<TestServer>();
  }
  Inbox inbox;
  Job job{backend, "job", 3, 3};
  Node x(inbox, b.settings(job, "x"));
  Node y(inbox, b.settings(job, "y"));
  Node z(inbox, b.settings(job, "z"));
  form_round(inbox, {&x, &y, &z}, {"x", "y", "z"});
  auto raw = b.raw();
  // A key that no member wrote (a node of an earlier attempt, say): a count of the keys
  // would reach the number of members with z missing; the barrier must not.
  raw->set("round_0/done/intruder", "1");
  x.finish();
  y.finish();
  REQUIRE(eventually([&] { return raw->check({"round_0/done/x", "round_0/done/y"}); }));
  CHECK_FALSE(inbox.take("x", Event::Kind::kDone, kQuiet));
  CHECK_FALSE(inbox.take("y", Event::Kind::kDone, 0ms));
  CHECK_FALSE(raw->check({"round_0/end"}));
  z.finish();
  for (const char* name : {"x", "y", "z"}) {
    auto done = inbox.take(name, Event::Kind::kDone);
    REQUIRE(done);
    CHECK(done->done);
  }
}

TEST_CASE("exit barrier: a transient etcd failure on the way is retried, and the job finishes") {
  if (!EtcdCluster::available()) return ddp::test::skip(EtcdCluster::kMissing);
  EtcdCluster cluster(EtcdClusterOptions{.members = 1});
  FaultProxy proxy(cluster.endpoint(0));
  Inbox inbox;
  Job job{"etcd", "job", 2, 2};
  std::mutex mutex;
  std::vector<std::string> notices;
  auto via_proxy = settings_for(0, job, "a");
  via_proxy.etcd.endpoints = proxy.endpoint();
  via_proxy.notice = [&](const std::string& line) {
    std::lock_guard lock(mutex);
    notices.push_back(line);
  };
  auto direct = settings_for(0, job, "b");
  direct.etcd.endpoints = cluster.endpoints();
  Node a(inbox, via_proxy);
  Node b(inbox, direct);
  form_round(inbox, {&a, &b}, {"a", "b"});
  // a's first write in the barrier and the fence after it get garbage back: a store error.
  proxy.arm(Fault::kGarbage, "/v3/kv/txn", 2);
  a.finish();
  b.finish();
  for (const char* name : {"a", "b"}) {
    auto done = inbox.take(name, Event::Kind::kDone);
    REQUIRE(done);
    CHECK(done->done);
  }
  CHECK(proxy.armed() == 0);
  std::lock_guard lock(mutex);
  bool told = false;
  for (const auto& line : notices) told |= line.find("exit barrier") != std::string::npos;
  CHECK(told);
}
