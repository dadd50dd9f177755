#include "host/local_rendezvous.hpp"

#include <utility>

namespace ddp::launcher {

LocalRendezvous::LocalRendezvous(elastic::NodeInfo self, std::string master_addr, int master_port)
    : self_(std::move(self)), master_addr_(std::move(master_addr)), master_port_(master_port) {}

void LocalRendezvous::next_round(int, std::function<void(elastic::RoundInfo)> on_round,
                                 std::function<void(std::exception_ptr)>,
                                 std::function<void(elastic::WaitStatus)>) {
  if (next_round_ > 0 && last_round_failed_) ++restart_count_;
  last_round_failed_ = false;
  on_stop_ = nullptr;
  elastic::RoundInfo round;
  round.round = next_round_++;
  round.restart_count = restart_count_;
  round.group_rank = 0;
  round.members.push_back(
      elastic::Member{self_.node_id, self_.host, self_.addr, self_.local_world_size, self_.role});
  round.master_addr = master_addr_;
  round.master_port = master_port_;
  on_round(std::move(round));
}

void LocalRendezvous::watch_round(std::function<void(elastic::StopReason)> on_stop) {
  on_stop_ = std::move(on_stop);
}

void LocalRendezvous::stop_round(elastic::StopReason reason) {
  last_round_failed_ = reason.failed();
  if (auto on_stop = std::exchange(on_stop_, nullptr)) on_stop(std::move(reason));
}

void LocalRendezvous::finish_round(std::function<void(bool)> on_done) { on_done(true); }

}  // namespace ddp::launcher
