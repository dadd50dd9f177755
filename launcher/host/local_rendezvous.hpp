#pragma once
// The rendezvous of a single-node job (--nnodes=1, --standalone): a trivial in-process
// Rendezvous with one member, so that one state machine runs single and multi-node jobs, at
// the speed of a single-node launch (every round closes at once, nothing touches a network).
// Internal to the launcher.

#include "ddp/elastic/rendezvous.hpp"

namespace ddp::launcher {

class LocalRendezvous : public elastic::Rendezvous {
 public:
  // self: this node; its addr is not used. The round's master is master_addr:master_port
  // (the agent's store or a reserved port).
  LocalRendezvous(elastic::NodeInfo self, std::string master_addr, int master_port);

  // Calls on_round at once with round n+1, whose restart count is one more than the last
  // round's when that round stopped because a worker failed.
  void next_round(int worker_store_port, std::function<void(elastic::RoundInfo)> on_round,
                  std::function<void(std::exception_ptr)> on_error,
                  std::function<void(elastic::WaitStatus)> on_wait) override;
  void watch_round(std::function<void(elastic::StopReason)> on_stop) override;
  // Reports reason to the watcher at once (the only node, so its reason wins).
  void stop_round(elastic::StopReason reason) override;
  // on_done(true) at once: there is no other node to wait for.
  void finish_round(std::function<void(bool all_succeeded)> on_done) override;
  void leave() override {}
  std::string endpoint() const override { return "local"; }

 private:
  elastic::NodeInfo self_;
  std::string master_addr_;
  int master_port_;
  int next_round_ = 0;
  int restart_count_ = 0;
  bool last_round_failed_ = false;
  std::function<void(elastic::StopReason)> on_stop_;
};

}  // namespace ddp::launcher
