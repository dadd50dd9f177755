// The static and c10d backends: the run's keys in a c10d store that one agent serves, nodes
// alive by heartbeat counters (run_backend.hpp).

#include <algorithm>

#include "ddp/elastic/heartbeat_monitor.hpp"
#include "ddp/store/client.hpp"
#include "ddp/store/store_util.hpp"
#include "run_backend.hpp"
#include "store_session.hpp"

namespace ddp::elastic {
namespace {

// Reads the counters of the nodes it is asked about and calls a node dead when its counter
// did not move for the heartbeat budget, on this observer's own clock.
class CounterObserver final : public LivenessObserver {
 public:
  CounterObserver(RunKeys keys, std::chrono::milliseconds budget)
      : keys_(std::move(keys)), monitor_(budget) {}

  std::vector<std::string> dead(store::Store& store,
                                const std::vector<std::string>& node_ids) override {
    if (node_ids.empty()) return {};
    std::vector<std::string> keys;
    for (const auto& id : node_ids) keys.push_back(keys_.heartbeat(id));
    auto counters = store.multi_get(keys);
    auto now = Clock::now();
    for (std::size_t i = 0; i < node_ids.size(); ++i) {
      monitor_.observe(node_ids[i], store::parse_counter(counters[i]).value_or(0), now);
    }
    return monitor_.stale(node_ids, now);
  }

 private:
  RunKeys keys_;
  HeartbeatMonitor monitor_;
};

class StoreBackend final : public RunBackend {
 public:
  explicit StoreBackend(const RendezvousSettings& settings)
      : settings_(settings),
        where_(settings.store_host + ":" + std::to_string(settings.store_port)) {}

  std::string where() const override { return where_; }
  RunKeys keys() const override { return RunKeys(RunKeys::run_prefix(settings_.run_id)); }

  std::unique_ptr<store::Store> connect(
      Clock::time_point deadline, const std::atomic<bool>& cancel,
      const std::function<void(const std::string&)>& on_failure) const override {
    // Each attempt (and each later reconnect) tries for kConnectSlice, so that a dead store
    // is retried with back-off, never in a tight loop, and cancellation is seen in time.
    return connect_with_retries(
        deadline, cancel, on_failure, std::chrono::milliseconds(0),
        [this]() -> std::unique_ptr<store::Store> {
          return std::make_unique<store::Client>(options(kConnectSlice));
        },
        [this](std::chrono::milliseconds tried, const std::string& error) {
          return "could not reach the rendezvous store at " + where_ + " for " +
                 seconds_text(tried) + " (" + error +
                 "); is the agent of node 0 (the host of --master_addr or --rdzv_endpoint) "
                 "running, and is that address reachable from here?";
        });
  }

  std::unique_ptr<store::Store> connect_once(std::chrono::milliseconds bound) const override {
    auto o = options(bound);
    o.timeout = std::min(o.timeout, bound);
    return std::make_unique<store::Client>(o);
  }

  void announce(store::Store& store, const std::string& node_id) override {
    store.add(keys().heartbeat(node_id), 1);
  }
  void beat(store::Store& store, const std::string& node_id) override {
    store.add(keys().heartbeat(node_id), 1);
  }
  void retire(store::Store&, const std::string&) override {}  // the counter just stops

  std::unique_ptr<LivenessObserver> observer() const override {
    return std::make_unique<CounterObserver>(keys(), heartbeat_budget(settings_.timeouts));
  }

  std::string dead_text() const override {
    const auto& t = settings_.timeouts;
    return "no heartbeat for " + seconds_text(heartbeat_budget(t)) + ": keep_alive_interval " +
           seconds_text(t.keep_alive) + " x keep_alive_max_attempt " +
           std::to_string(t.keep_alive_max_attempt);
  }

  std::chrono::milliseconds failure_budget() const override {
    return heartbeat_budget(settings_.timeouts);
  }

  std::string lost_text(const std::string& what) const override {
    return "lost the rendezvous store at " + where_ + ": " + what +
           "; did the agent hosting it (node 0, or the --rdzv_endpoint host) exit?";
  }

 private:
  store::ClientOptions options(std::chrono::milliseconds connect_timeout) const {
    store::ClientOptions o;
    o.host = settings_.store_host;
    o.port = static_cast<std::uint16_t>(settings_.store_port);
    o.dialect = store::Dialect::V2;
    o.connect_timeout = connect_timeout;
    o.timeout = settings_.timeouts.read;
    return o;
  }

  RendezvousSettings settings_;
  std::string where_;
};

}  // namespace

std::unique_ptr<RunBackend> make_store_backend(const RendezvousSettings& settings) {
  return std::make_unique<StoreBackend>(settings);
}

}  // namespace ddp::elastic
