// The etcd backend (--rdzv_backend=etcd or etcd-v2): the run's keys in an etcd cluster under
// /ddprun/<run_id>/, every change a transaction that compares revisions (EtcdStore), nodes
// alive by leases (run_backend.hpp). No agent hosts the state, so the job survives the loss of
// any node as long as etcd keeps a quorum.

#include <algorithm>
#include <cmath>
#include <mutex>
#include <set>
#include <stdexcept>
#include <unordered_map>
#include <utility>

#include "ddp/etcd/etcd_store.hpp"
#include "run_backend.hpp"
#include "store_session.hpp"

namespace ddp::elastic {
namespace {

// The connections the backend made, by the store::Store the engine holds them as: the
// backend's hooks get one back as a store::Store& and use its etcd side (leases, ranges). A
// connection registers itself when made and leaves when destroyed; shared, so that it may
// outlive the backend.
class Connections {
 public:
  void add(const store::Store* store, etcd::EtcdStore* etcd) {
    std::lock_guard lock(mutex_);
    made_[store] = etcd;
  }
  void remove(const store::Store* store) {
    std::lock_guard lock(mutex_);
    made_.erase(store);
  }
  etcd::EtcdStore& of(store::Store& store) const {
    std::lock_guard lock(mutex_);
    auto it = made_.find(&store);
    if (it == made_.end()) {
      throw std::logic_error("the etcd backend was given a store it did not make");
    }
    return *it->second;
  }

 private:
  mutable std::mutex mutex_;
  std::unordered_map<const store::Store*, etcd::EtcdStore*> made_;
};

// An EtcdStore that is in `connections` for as long as it lives.
class ConnectionOfBackend final : public etcd::EtcdStore {
 public:
  ConnectionOfBackend(std::shared_ptr<Connections> connections, etcd::ClientOptions options,
                      std::string prefix, std::chrono::milliseconds timeout)
      : EtcdStore(std::move(options), std::move(prefix), timeout),
        connections_(std::move(connections)) {
    connections_->add(this, this);
  }
  ~ConnectionOfBackend() override { connections_->remove(this); }

 private:
  std::shared_ptr<Connections> connections_;
};

// A node is dead once its lease expired: etcd deleted its hb/<node_id>.
class LeaseObserver final : public LivenessObserver {
 public:
  LeaseObserver(RunKeys keys, std::shared_ptr<const Connections> connections)
      : keys_(std::move(keys)), connections_(std::move(connections)) {}

  std::vector<std::string> dead(store::Store& store,
                                const std::vector<std::string>& node_ids) override {
    if (node_ids.empty()) return {};
    auto present = connections_->of(store).keys_under(keys_.heartbeats());
    std::set<std::string> alive(present.begin(), present.end());
    std::vector<std::string> out;
    for (const auto& id : node_ids) {
      if (!alive.contains(keys_.heartbeat(id))) out.push_back(id);
    }
    return out;
  }

 private:
  RunKeys keys_;
  std::shared_ptr<const Connections> connections_;
};

etcd::ClientOptions client_options(const EtcdSettings& s) {
  etcd::ClientOptions o;
  try {
    o.endpoints = etcd::parse_endpoints(s.endpoints);
  } catch (const std::invalid_argument& e) {
    throw RendezvousError("--rdzv_endpoint=" + s.endpoints + ": " + e.what());
  }
  if (o.endpoints.empty()) {
    throw RendezvousError(
        "--rdzv_backend=etcd needs --rdzv_endpoint=HOST:PORT[,HOST:PORT...], the client "
        "addresses of the etcd members");
  }
  o.tls = s.tls;
  o.cacert = s.cacert;
  o.cert = s.cert;
  o.key = s.key;
  o.user = s.user;
  o.password = s.password;
  return o;
}

class EtcdBackend final : public RunBackend {
 public:
  explicit EtcdBackend(const RendezvousSettings& settings)
      : settings_(settings),
        options_(client_options(settings.etcd)),
        where_("etcd at " + settings.etcd.endpoints) {}

  std::string where() const override { return where_; }
  // EtcdStore adds /ddprun/<run_id>/ itself.
  RunKeys keys() const override { return RunKeys(""); }

  std::unique_ptr<store::Store> connect(
      Clock::time_point deadline, const std::atomic<bool>& cancel,
      const std::function<void(const std::string&)>& on_failure) const override {
    return connect_with_retries(
        deadline, cancel, on_failure, kConnectSlice / 4,  // back-off between rounds of members
        [this]() -> std::unique_ptr<store::Store> {
          try {
            auto store = make_store(options_);
            store->check({keys().state()});  // one request: is a member there, and serving?
            return store;
          } catch (const etcd::EtcdError& e) {
            if (e.kind() != etcd::EtcdError::Kind::kRefused) throw;
            throw RendezvousError(where_ + " refused this agent: " + std::string(e.what()));
          }
        },
        [this](std::chrono::milliseconds tried, const std::string& error) {
          return "could not reach " + where_ + " for " + seconds_text(tried) + " (" + error +
                 "); are the etcd members running, and are the --rdzv_endpoint addresses "
                 "(their client URLs) reachable from here?";
        });
  }

  // Connects on its first request: etcd failing right as a round starts is then retried by
  // the watch (for failure_budget(), with its notice) like any later failure.
  std::unique_ptr<store::Store> connect_watcher(Clock::time_point,
                                                const std::atomic<bool>&) const override {
    return make_store(options_);
  }

  std::unique_ptr<store::Store> connect_once(std::chrono::milliseconds bound) const override {
    auto o = options_;
    o.connect_timeout = std::min(o.connect_timeout, bound);
    o.request_timeout = std::min(o.request_timeout, bound);
    return make_store(o);
  }

  void announce(store::Store& store, const std::string& node_id) override {
    auto& etcd = connections_->of(store);
    etcd.set_with_lease(keys().heartbeat(node_id), "1", lease(etcd));
  }

  void beat(store::Store& store, const std::string& node_id) override {
    auto& etcd = connections_->of(store);
    std::int64_t id = 0;
    {
      std::lock_guard lock(lease_mutex_);
      id = lease_;
    }
    if (id == 0) return announce(store, node_id);
    try {
      etcd.client().keep_alive(id);
    } catch (const etcd::EtcdError& e) {
      if (e.kind() != etcd::EtcdError::Kind::kLeaseExpired) throw;
      // This node was silent for longer than the TTL (the others may have dropped it): show
      // up again under a new lease; the round logic decides what that node is now.
      {
        std::lock_guard lock(lease_mutex_);
        if (lease_ == id) lease_ = 0;
      }
      announce(store, node_id);
    }
  }

  void retire(store::Store& store, const std::string& node_id) override {
    auto& etcd = connections_->of(store);
    std::int64_t id = 0;
    {
      std::lock_guard lock(lease_mutex_);
      id = std::exchange(lease_, 0);
    }
    if (id != 0) etcd.client().revoke(id);  // deletes hb/<node_id> with it
    etcd.delete_key(keys().heartbeat(node_id));
  }

  std::unique_ptr<LivenessObserver> observer() const override {
    return std::make_unique<LeaseObserver>(keys(), connections_);
  }

  // One range over round_<r>/done/.
  bool all_arrived(store::Store& store, int round,
                   const std::vector<std::string>& node_ids) override {
    auto present = arrived(store, round);
    return std::all_of(node_ids.begin(), node_ids.end(),
                       [&](const std::string& id) { return present.contains(id); });
  }
  bool any_arrived(store::Store& store, int round,
                   const std::vector<std::string>& node_ids) override {
    auto present = arrived(store, round);
    return std::any_of(node_ids.begin(), node_ids.end(),
                       [&](const std::string& id) { return present.contains(id); });
  }

  std::string dead_text() const override {
    const auto& t = settings_.timeouts;
    return "its etcd lease expired, no keep-alive for " + seconds_text(heartbeat_budget(t)) +
           ": keep_alive_interval " + seconds_text(t.keep_alive) + " x keep_alive_max_attempt " +
           std::to_string(t.keep_alive_max_attempt);
  }

  // etcd may be back soon (a member restarts, a leader is elected): give it the join timeout.
  std::chrono::milliseconds failure_budget() const override {
    return std::max(settings_.timeouts.join, heartbeat_budget(settings_.timeouts));
  }

  std::string lost_text(const std::string& what) const override {
    return "lost " + where_ + " for " + seconds_text(failure_budget()) + ": " + what +
           "; a job on etcd needs a majority of its members: restart the members that are "
           "down, then this job again";
  }

 private:
  std::unique_ptr<etcd::EtcdStore> make_store(const etcd::ClientOptions& options) const {
    auto store = std::make_unique<ConnectionOfBackend>(
        connections_, options, RunKeys::run_prefix(settings_.run_id), settings_.timeouts.read);
    store->wake_on_delete(keys().heartbeats());
    return store;
  }

  // The ids of the nodes whose round_<r>/done/<id> exists.
  std::set<std::string> arrived(store::Store& store, int round) const {
    std::string prefix = keys().done(round);
    std::set<std::string> ids;
    for (const auto& key : connections_->of(store).keys_under(prefix))
      ids.insert(key.substr(prefix.size()));
    return ids;
  }

  // This agent's lease, granted on first use with a TTL of the heartbeat budget.
  std::int64_t lease(etcd::EtcdStore& etcd) {
    std::lock_guard lock(lease_mutex_);
    if (lease_ == 0) {
      auto budget = heartbeat_budget(settings_.timeouts);
      auto ttl = std::chrono::seconds(static_cast<long long>(std::ceil(budget.count() / 1000.0)));
      lease_ = etcd.client().grant_lease(std::max(ttl, std::chrono::seconds(1))).id;
    }
    return lease_;
  }

  RendezvousSettings settings_;
  etcd::ClientOptions options_;
  std::string where_;
  std::mutex lease_mutex_;
  std::int64_t lease_ = 0;
  std::shared_ptr<Connections> connections_ = std::make_shared<Connections>();
};

}  // namespace

std::unique_ptr<RunBackend> make_etcd_backend(const RendezvousSettings& settings) {
  return std::make_unique<EtcdBackend>(settings);
}

}  // namespace ddp::elastic
