#pragma once
// Which Rendezvous an agent runs and the stores it serves for it. One node: a LocalRendezvous
// whose master is the MasterHost (today's agent store at MASTER_PORT). Several nodes: the
// store engine (make_store_rendezvous), the rendezvous store served by this agent when it is
// the host (static: node rank 0; c10d: the endpoint's host or is_host=1; a server another
// process runs at that port is joined as a client, as torchrun does), and for c10d a fresh worker
// store per round. Internal to the launcher; lives on the agent's loop.

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include "ddp/elastic/rendezvous.hpp"
#include "ddp/launcher/launch_config.hpp"
#include "ddp/launcher/master_endpoint.hpp"
#include "ddp/store/server.hpp"

namespace ddp::launcher {

// After a job that passed the exit barrier or failed, how long the agent serving the
// rendezvous store keeps it up for the agents that have not read how it ended yet.
inline constexpr std::chrono::milliseconds kStoreLingerTimeout{5000};
// How often it looks whether they are gone.
inline constexpr std::chrono::milliseconds kStoreLingerCheck{20};
// When the rendezvous store's port is taken on this host and nothing listens there (another
// program's connection holds it), how often the agent that should host it tries again.
inline constexpr std::chrono::milliseconds kHostRetryInterval{500};

struct RendezvousHostOptions {
  MasterHostFactory master_host;                   // one node: who serves MASTER_PORT
  std::function<void(const std::string&)> notice;  // a line for the console
};

// It is also the Rendezvous the agent's machine uses: every call goes to the engine, except
// that leave() runs on a thread of its own, so that the loop never blocks on it (the store it
// talks to may be the one this loop serves).
class RendezvousHost : public elastic::Rendezvous {
 public:
  // Throws UsageError for --rdzv_conf / endpoint values it cannot use, StoreError when a
  // store cannot be served, whatever make_store_rendezvous throws.
  RendezvousHost(boost::asio::io_context& io, const LaunchConfig& config, elastic::NodeInfo self,
                 RendezvousHostOptions options);
  ~RendezvousHost() override;  // the engine (and its threads) ends before the stores close

  // When this agent serves worker stores, the round's store is told its members (on the
  // loop, before on_round's own handlers run there) as the round closes.
  void next_round(int worker_store_port, std::function<void(elastic::RoundInfo)> on_round,
                  std::function<void(std::exception_ptr)> on_error,
                  std::function<void(elastic::WaitStatus)> on_wait) override;
  void watch_round(std::function<void(elastic::StopReason)> on_stop) override {
    rendezvous_->watch_round(std::move(on_stop));
  }
  void stop_round(elastic::StopReason reason) override {
    rendezvous_->stop_round(std::move(reason));
  }
  void finish_round(std::function<void(bool)> on_done) override {
    rendezvous_->finish_round(std::move(on_done));
  }
  // Returns at once; the engine's leave() runs on a thread of its own. Only the first call
  // (before shut_down) does anything.
  void leave() override;
  std::string endpoint() const override { return rendezvous_->endpoint(); }

  // TORCHELASTIC_USE_AGENT_STORE: the workers' master is a store an agent serves.
  bool workers_use_agent_store() const { return agent_store_; }
  // c10d: every round gets a fresh worker store, served by its group rank 0.
  bool serves_worker_stores() const { return worker_stores_; }
  // Opens this round's worker store on every address at a port the kernel picks (closing the
  // last round's) and returns the port. Until the round closes it serves loopback and holds
  // other peers; then it admits the round's nodes and loopback (store_admission.hpp), or
  // everyone with --store_allow_any.
  int open_worker_store();

  // True when this agent serves the rendezvous store to the other agents.
  bool hosts_rendezvous_store() const { return rendezvous_store_ != nullptr; }
  // The job is over, and this agent serves the rendezvous store: ends the rendezvous engine
  // on a thread of its own while the loop goes on serving the store (the engine's threads may
  // be waiting on it); then, when wait_for_others (the exit barrier passed, or the job
  // failed), waits until no other agent is connected to the store, at most
  // kStoreLingerTimeout, so that the last agents reading how the round ended do not lose the
  // store under them; then calls done on the loop. On the loop; a second call does nothing.
  void shut_down(bool wait_for_others, std::function<void()> done);
  // A second signal during shut_down: stop waiting for the other agents; done comes as soon
  // as the engine has ended (the loop keeps serving the store until then, so that the
  // engine's last calls, leave() included, are answered rather than waited out). On the loop.
  void hurry() { hurry_ = true; }

 private:
  void check_linger(std::chrono::steady_clock::time_point deadline, std::function<void()> done);

  // Serves the rendezvous store at port. When the port is taken: a server there is joined
  // as a client (as torchrun does); when nothing listens there, the agent waits as a client
  // and retries hosting (retry_hosting) until it serves the store or a server listens there.
  void host_rendezvous_store(const std::string& where, int port);
  store::ServerOptions rendezvous_store_options(int port) const;
  void retry_hosting(int port);

  boost::asio::io_context& io_;
  RendezvousHostOptions options_;
  bool agent_store_ = false;
  bool worker_stores_ = false;
  bool store_allow_any_ = false;                     // --store_allow_any
  std::unique_ptr<MasterHost> master_;               // one node
  std::unique_ptr<store::Server> rendezvous_store_;  // several, when this agent hosts it
  // c10d, etcd: this round's (shared with the handler that sets its members, which must not
  // touch a later round's store).
  std::shared_ptr<store::Server> worker_store_;
  std::unique_ptr<elastic::Rendezvous> rendezvous_;
  boost::asio::steady_timer linger_timer_;
  boost::asio::steady_timer host_retry_timer_;  // retry_hosting
  bool hurry_ = false;                          // hurry() was called
  bool left_ = false;                           // leave() was called
  std::thread leaver_;                          // the engine's leave(), off the loop
  std::thread closer_;                          // ends the engine off the loop (shut_down)
};

}  // namespace ddp::launcher
