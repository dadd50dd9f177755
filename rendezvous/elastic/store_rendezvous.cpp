// The Rendezvous over a c10d store (static and c10d backends): threads, clients and callbacks
// around the round logic (round_state.cpp), the join loop (round_joiner.cpp) and the watch
// and exit barrier (round_watcher.cpp). The protocol is described in docs/elastic.md, "How
// rounds work".

#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <random>
#include <thread>

#include "ddp/common/task_queue.hpp"
#include "ddp/elastic/rendezvous.hpp"
#include "ddp/store/local_address.hpp"
#include "round_joiner.hpp"
#include "round_watcher.hpp"
#include "store_session.hpp"

namespace ddp::elastic {
namespace {

// leave() is best effort: each store step takes at most close_timeout (torchrun's bound on
// shutting a rendezvous down), and never more than this.
constexpr std::chrono::milliseconds kLeaveTimeout = std::chrono::seconds(5);

std::string random_node_id(const std::string& host) {
  std::random_device device;
  char suffix[16];
  std::snprintf(suffix, sizeof suffix, "%08x", static_cast<unsigned>(device()));
  return host + "_" + std::to_string(::getpid()) + "_" + suffix;
}

void validate(RendezvousSettings& settings) {
  const std::string& backend = settings.backend;
  if (backend != "static" && backend != "c10d" && backend != "etcd" && backend != "etcd-v2") {
    throw RendezvousError("unknown rendezvous backend '" + backend +
                          "' (static, c10d, etcd or etcd-v2)");
  }
  if (settings.min_nodes < 1 || settings.max_nodes < settings.min_nodes) {
    throw RendezvousError("--nnodes=" + std::to_string(settings.min_nodes) + ":" +
                          std::to_string(settings.max_nodes) +
                          " is not a range of at least one node");
  }
  if (backend == "static" && !settings.self.fixed_group_rank) {
    throw RendezvousError("the static rendezvous needs this node's --node_rank");
  }
  if (settings.self.node_id.empty()) settings.self.node_id = random_node_id(settings.self.host);
}

class StoreRendezvous final : public Rendezvous {
 public:
  explicit StoreRendezvous(RendezvousSettings settings)
      : session_(std::move(settings)), heartbeat_([this] { heartbeat_loop(); }) {}

  ~StoreRendezvous() override {
    silence();
    cancel();
    stop_heartbeats();
    // The task threads (members declared last) join before the clients they use go away.
  }

  void next_round(int worker_store_port, std::function<void(RoundInfo)> on_round,
                  std::function<void(std::exception_ptr)> on_error,
                  std::function<void(WaitStatus)> on_wait) override {
    std::optional<int> last_round;
    if (auto current = current_round()) last_round = current->round;
    rounds_.submit([=, this] {
      auto deadline = Clock::now() + session_.settings.timeouts.join;
      try {
        store::Store& store = client(round_client_, deadline);
        auto notice = [this, on_wait](WaitStatus status) {
          deliver([&] {
            if (on_wait) on_wait(status);
          });
        };
        RoundJoiner joiner(session_, store, participant(worker_store_port), last_round, notice);
        RoundInfo info = joiner.run();
        {
          std::lock_guard lock(mutex_);
          current_ = info;
        }
        deliver([&] { on_round(info); });
      } catch (const Cancelled&) {
      } catch (const RendezvousError&) {
        auto error = std::current_exception();
        deliver([&] { on_error(error); });
      } catch (const std::exception& e) {
        auto error = std::make_exception_ptr(RendezvousError("rendezvous at " + session_.endpoint +
                                                             " failed: " + std::string(e.what())));
        deliver([&] { on_error(error); });
      }
    });
  }

  void watch_round(std::function<void(StopReason)> on_stop) override {
    auto round = current_round();
    if (!round) return;
    watcher_.submit([this, round = *round, on_stop] {
      try {
        if (!watch_client_) {
          keep(watch_client_, session_.backend->connect_watcher(
                                  Clock::now() + session_.heartbeat_budget(), session_.cancel));
        }
        store::Store& store = *watch_client_;
        auto reason = watch_until_end(session_, store, round, session_.settings.self.node_id);
        if (reason) deliver_stop(round.round, *reason, on_stop);
      } catch (const Cancelled&) {
      } catch (const std::exception& e) {  // the store could not be reached at all
        auto lost = make_stop(StopReason::Kind::kNodeLost, "", session_.settings.store_host);
        lost.message = e.what();
        deliver_stop(round.round, lost, on_stop);
      }
    });
  }

  void stop_round(StopReason reason) override {
    auto round = current_round();
    if (!round) return;
    if (reason.node_id.empty()) reason.node_id = session_.settings.self.node_id;
    if (reason.host.empty()) reason.host = session_.settings.self.host;
    // On the round thread, so that a next_round called after this sees the reason written.
    rounds_.submit([this, r = round->round, reason] {
      try {
        store::Store& store = client(round_client_, Clock::now() + session_.heartbeat_budget());
        session_.end_round(store, r, RoundEnd{false, reason});
      } catch (const Cancelled&) {
      } catch (const std::exception&) {
        // The store is gone: the watcher reports that on its own.
      }
    });
  }

  void finish_round(std::function<void(bool all_succeeded)> on_done) override {
    auto round = current_round();
    if (!round) return;
    rounds_.submit([this, round = *round, on_done] {
      bool passed = false;
      try {
        store::Store& store = client(round_client_, Clock::now() + session_.heartbeat_budget());
        passed = pass_exit_barrier(session_, store, round);
      } catch (const Cancelled&) {
        return;
      } catch (const std::exception&) {
        passed = false;
      }
      deliver([&] { on_done(passed); });
    });
  }

  void leave() override {
    silence();
    cancel();
    stop_heartbeats();
    const NodeInfo& self = session_.settings.self;
    try {
      auto bound = std::min(session_.settings.timeouts.close, kLeaveTimeout);
      auto store = session_.backend->connect_once(bound);
      std::optional<int> running;
      session_.modify(*store, [&](const std::optional<RoundState>& current) {
        running.reset();
        if (!current) return std::optional<RoundState>();
        if (current->phase == Phase::kRunning && is_participant(*current, self.node_id)) {
          running = current->round;
        }
        return remove_node(*current, self.node_id);
      });
      if (running) {
        auto left = make_stop(StopReason::Kind::kNodeLeft, self.node_id, self.host);
        session_.end_round(*store, *running, RoundEnd{false, left});
      }
      session_.backend->retire(*store, self.node_id);
    } catch (const std::exception&) {
      // Best effort: the others notice the silent heartbeat instead.
    }
  }

  std::string endpoint() const override { return session_.endpoint; }

 private:
  // Calls f unless the agent left (or is destroying this handler).
  template <class F>
  void deliver(F&& f) {
    std::lock_guard lock(deliver_mutex_);
    if (!silenced_) f();
  }

  void silence() {
    std::lock_guard lock(deliver_mutex_);
    silenced_ = true;
  }

  // on_stop once per round, whichever thread gets there first.
  void deliver_stop(int round, const StopReason& reason,
                    const std::function<void(StopReason)>& on_stop) {
    {
      std::lock_guard lock(mutex_);
      if (stop_delivered_for_ >= round) return;
      stop_delivered_for_ = round;
    }
    deliver([&] { on_stop(reason); });
  }

  std::optional<RoundInfo> current_round() const {
    std::lock_guard lock(mutex_);
    return current_;
  }

  // The client of the calling task thread, connected on first use (until deadline).
  store::Store& client(std::unique_ptr<store::Store>& slot, Clock::time_point deadline) {
    if (!slot) keep(slot, session_.connect(deadline));
    return *slot;
  }

  // Puts a task thread's new client in its slot, where cancel() can reach it.
  void keep(std::unique_ptr<store::Store>& slot, std::unique_ptr<store::Store> fresh) {
    std::lock_guard lock(clients_mutex_);
    slot = std::move(fresh);
    if (session_.cancel.load()) slot->interrupt();  // cancel() ran before it was here
  }

  // Ends every task at once: the flag ends their loops, and interrupting their clients ends
  // a call blocked on a store that does not answer (else up to the read timeout).
  void cancel() {
    session_.cancel = true;
    std::lock_guard lock(clients_mutex_);
    for (auto* slot : {&round_client_, &watch_client_}) {
      if (*slot) (*slot)->interrupt();
    }
  }

  // This node as the round state records it; its address found once, on the round thread.
  Participant participant(int worker_store_port) {
    const NodeInfo& self = session_.settings.self;
    if (resolved_addr_.empty()) {
      resolved_addr_ = self.addr;
      if (resolved_addr_.empty()) {
        resolved_addr_ = store::local_address_towards(session_.settings.store_host,
                                                      session_.settings.store_port);
      }
      if (resolved_addr_.empty()) resolved_addr_ = self.host;
    }
    return Participant{self.node_id,          self.host, resolved_addr_,
                       self.local_world_size, self.role, self.fixed_group_rank,
                       worker_store_port};
  }

  // One heartbeat (a counter ADD, or an etcd lease renewal) every keep_alive_interval until
  // stop_heartbeats().
  void heartbeat_loop() {
    std::unique_ptr<store::Store> store;
    bool odd_answer = false;  // the last beat failed with something not a StoreError
    const std::string& node_id = session_.settings.self.node_id;
    std::unique_lock lock(heartbeat_mutex_);
    while (!heartbeat_stop_) {
      lock.unlock();
      try {
        if (!store) store = session_.backend->connect_once(kConnectSlice);
        session_.backend->beat(*store, node_id);
        odd_answer = false;
      } catch (const store::StoreError&) {
        // The round and watch threads report a lost store; keep trying until stopped.
      } catch (const std::exception& e) {
        // Anything else (an answer of a type nobody expected) is a failing store too: say
        // so once, start again on a new connection, and never end the agent from here.
        if (!odd_answer) {
          session_.notice("ddprun: a heartbeat to " + session_.endpoint +
                          " failed with an unexpected answer (" + e.what() +
                          "); retrying on a new connection");
        }
        odd_answer = true;
        store.reset();
      }
      lock.lock();
      heartbeat_wake_.wait_for(lock, session_.settings.timeouts.keep_alive,
                               [&] { return heartbeat_stop_; });
    }
  }

  void stop_heartbeats() {
    {
      std::lock_guard lock(heartbeat_mutex_);
      heartbeat_stop_ = true;
    }
    heartbeat_wake_.notify_all();
    if (heartbeat_.joinable()) heartbeat_.join();
  }

  StoreSession session_;
  std::mutex deliver_mutex_;
  bool silenced_ = false;
  mutable std::mutex mutex_;
  std::optional<RoundInfo> current_;  // the last round delivered
  int stop_delivered_for_ = -1;
  std::string resolved_addr_;  // round thread only
  // Each used by its own thread only (a Client serialises its calls); set under
  // clients_mutex_, so that cancel() may interrupt them from another thread.
  std::mutex clients_mutex_;
  std::unique_ptr<store::Store> round_client_;
  std::unique_ptr<store::Store> watch_client_;
  std::mutex heartbeat_mutex_;
  std::condition_variable heartbeat_wake_;
  bool heartbeat_stop_ = false;
  std::thread heartbeat_;
  // Declared last: destroyed (joined) first.
  // Queued work is dropped at destruction: tasks watch the cancel flag, and queued ones are
  // moot once the engine stops.
  common::TaskQueue rounds_{
      common::TaskQueue::AtStop::kDropQueued};  // next_round, stop_round, finish_round, in the
                                                // order called
  common::TaskQueue watcher_{common::TaskQueue::AtStop::kDropQueued};  // watch_round
};

}  // namespace

std::unique_ptr<Rendezvous> make_store_rendezvous(RendezvousSettings settings) {
  validate(settings);
  return std::make_unique<StoreRendezvous>(std::move(settings));
}

}  // namespace ddp::elastic
