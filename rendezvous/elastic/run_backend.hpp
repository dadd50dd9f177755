#pragma once
// What differs between the rendezvous backends, behind one interface: where a run's keys live
// (a c10d store served by an agent, or etcd), how an engine thread reaches them, how a node
// shows that it lives, and how the others learn that it died. The round logic, the join loop
// and the watch run unchanged on every backend. Private to rendezvous/elastic/.
//
// store (static, c10d): hb/<node_id> is a counter the node ADDs every keep_alive_interval;
//   an observer calls a node dead when its counter did not move for the heartbeat budget.
// etcd: hb/<node_id> is bound to the node's lease, renewed every keep_alive_interval with a
//   TTL of the heartbeat budget; when the node dies, etcd deletes the key, every waiting
//   watch wakes, and an observer calls a node dead when its key is gone.

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ddp/elastic/rendezvous.hpp"
#include "ddp/store/store.hpp"
#include "run_keys.hpp"

namespace ddp::elastic {

// One observer per thread that judges liveness (it may keep what it saw before).
class LivenessObserver {
 public:
  virtual ~LivenessObserver() = default;
  // The ids among node_ids that are dead now. Throws StoreError when the store does.
  virtual std::vector<std::string> dead(store::Store& store,
                                        const std::vector<std::string>& node_ids) = 0;
};

class RunBackend {
 public:
  virtual ~RunBackend() = default;

  // Where the state lives, for messages: "H:P" or "etcd at H1:P1,H2:P2".
  virtual std::string where() const = 0;
  // The keys of the run, as this backend's connections name them.
  virtual RunKeys keys() const = 0;

  // A connection for one engine thread, retried with back-off until deadline (cancel looked
  // at between attempts); then a RendezvousError naming where() and how long it tried.
  // on_failure (may be empty) gets each failed attempt's error, for the waiting notice.
  virtual std::unique_ptr<store::Store> connect(
      std::chrono::steady_clock::time_point deadline, const std::atomic<bool>& cancel,
      const std::function<void(const std::string&)>& on_failure = {}) const = 0;
  // One attempt whose every call takes at most `bound` (leave(), heartbeats). Throws
  // StoreError.
  virtual std::unique_ptr<store::Store> connect_once(std::chrono::milliseconds bound) const = 0;
  // The watcher's connection (watch_round). By default connect(); a backend whose store
  // connects on first use returns it unverified, so that a failure shows up inside the
  // watch, with its notice and failure budget, not as an instant loss.
  virtual std::unique_ptr<store::Store> connect_watcher(
      std::chrono::steady_clock::time_point deadline, const std::atomic<bool>& cancel) const {
    return connect(deadline, cancel);
  }

  // Makes node_id count as alive, before it appears in the state. Throws StoreError.
  virtual void announce(store::Store& store, const std::string& node_id) = 0;
  // One heartbeat, every keep_alive_interval, on the heartbeat thread. Throws StoreError.
  virtual void beat(store::Store& store, const std::string& node_id) = 0;
  // The node leaves: it stops counting as alive at once where the backend can. Best effort.
  virtual void retire(store::Store& store, const std::string& node_id) = 0;

  // The exit barrier of round r (keys().done(r, id) set by each node that arrived): whether
  // every one of node_ids arrived, and whether any did. By default one CHECK of the keys (a
  // store has no range); a backend with ranges reads them at once. Throw StoreError.
  virtual bool all_arrived(store::Store& store, int round,
                           const std::vector<std::string>& node_ids) {
    std::vector<std::string> done;
    for (const auto& id : node_ids) done.push_back(keys().done(round, id));
    return store.check(done);
  }
  // By default the count of arrivals (keys().arrived(r)), which each member adds to after
  // setting its key.
  virtual bool any_arrived(store::Store& store, int round,
                           const std::vector<std::string>& /*node_ids*/) {
    return store.add(keys().arrived(round), 0) > 0;
  }

  virtual std::unique_ptr<LivenessObserver> observer() const = 0;

  // Why an observer called a node dead, for the stop reason ("no heartbeat for 15 s ...").
  virtual std::string dead_text() const = 0;

  // How long failing calls are retried before the state counts as lost (the joiner's and the
  // watcher's budget).
  virtual std::chrono::milliseconds failure_budget() const = 0;
  // What the agent is told once that budget ran out; `what` is the last error.
  virtual std::string lost_text(const std::string& what) const = 0;

  // Asked when a call failed: why the state is lost for good, at once, without waiting out the
  // failure budget; nullopt when it may come back. A store that one agent serves is gone for
  // good when its host refuses connections (the agent exited; its state went with it): the
  // answer of a live kernel, unlike the silence of a lost machine or network. By default
  // nothing is certain (etcd: a member may come back).
  virtual std::optional<std::string> lost_for_good(const std::string& /*what*/) const {
    return std::nullopt;
  }
};

// static and c10d: the store at settings.store_host:store_port.
std::unique_ptr<RunBackend> make_store_backend(const RendezvousSettings& settings);
// etcd (and etcd-v2): settings.etcd.
std::unique_ptr<RunBackend> make_etcd_backend(const RendezvousSettings& settings);

}  // namespace ddp::elastic
