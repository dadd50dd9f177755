#include "collective_exchange.hpp"

#include <stdexcept>

#include "../diagnosis/rank_view_json.hpp"
#include "ddp/store/client.hpp"
#include "workers_store_client.hpp"

namespace ddp::launcher {

CollectiveExchange::CollectiveExchange(std::function<void(const std::string&)> notice)
    : notice_(std::move(notice)) {}

CollectiveExchange::~CollectiveExchange() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::string CollectiveExchange::key(int round, int group_rank) {
  return "ddprun/collectives/" + std::to_string(round) + "/" + std::to_string(group_rank);
}

void CollectiveExchange::publish(const elastic::RoundInfo& round, std::vector<RankView> local) {
  if (round.members.size() <= 1) return;
  {
    std::lock_guard lock(mutex_);
    round_ = round;
    local_ = std::move(local);
  }
  // The thread starts with the first views to send: a one-node job never starts it.
  if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  wake_.notify_all();
}

std::vector<RankView> CollectiveExchange::remote() const {
  std::lock_guard lock(mutex_);
  std::vector<RankView> all;
  if (!round_ || remote_round_ != round_->round) return all;
  const auto now = std::chrono::steady_clock::now();
  for (const auto& [group_rank, received] : remote_) {
    std::vector<RankView> views = received.views;
    age_views(views, std::chrono::duration<double>(now - received.at).count());
    all.insert(all.end(), views.begin(), views.end());
  }
  return all;
}

void CollectiveExchange::run() {
  std::unique_lock lock(mutex_);
  while (true) {
    wake_.wait(lock, [this] { return stopping_ || local_.has_value(); });
    if (stopping_) return;
    const elastic::RoundInfo round = *round_;
    const std::vector<RankView> local = std::move(*local_);
    local_.reset();
    lock.unlock();
    try {
      exchange(round, local);
    } catch (const std::exception& e) {
      lock.lock();
      const bool said = failed_round_ == round.round;
      failed_round_ = round.round;
      lock.unlock();
      if (!said) {
        notice_(
            "ddprun: cannot share this node's collective records through the workers' "
            "store at " +
            round.master_addr + ":" + std::to_string(round.master_port) + " (" + e.what() +
            "); a hang report here covers only this node's ranks");
      }
    }
    lock.lock();
  }
}

// One round trip: this node's views out, every other node's in. A fresh connection each time
// keeps no state to go stale across rounds; it is a few requests a second at most.
void CollectiveExchange::exchange(const elastic::RoundInfo& round,
                                  const std::vector<RankView>& local) {
  store::Client client = connect_workers_store(round, kExchangeTimeout);
  client.set(key(round.round, round.group_rank), encode_views(local));
  std::map<int, Received> received;
  for (int g = 0; g < static_cast<int>(round.members.size()); ++g) {
    if (g == round.group_rank) continue;
    const std::string k = key(round.round, g);
    if (!client.check({k})) continue;
    std::vector<RankView> views = decode_views(client.get(k));
    for (RankView& view : views) view.remote = true;
    received[g] = {std::move(views), std::chrono::steady_clock::now()};
  }
  std::lock_guard lock(mutex_);
  if (remote_round_ != round.round) remote_.clear();
  remote_round_ = round.round;
  for (auto& [g, r] : received) remote_[g] = std::move(r);
}

}  // namespace ddp::launcher
