#include "collective_exchange.hpp"

#include <stdexcept>

#include "../diagnosis/rank_view_json.hpp"
#include "ddp/store/client.hpp"
#include "workers_store_client.hpp"

namespace ddp::launcher {
namespace {

// What a node's views say, ages aside: while only their ages change, nothing is written (the
// others age what they have).
std::string content_of(std::vector<RankView> views) {
  for (RankView& v : views) {
    if (v.since_finished_s) v.since_finished_s = 0.0;
    if (v.pending) v.pending->age_s = 0;
    if (v.last) v.last->age_s = 0;
  }
  return encode_views(views, false);
}

// "<seq>\n<views>", as send() writes it.
std::pair<std::uint64_t, std::vector<RankView>> parse(const std::string& value) {
  const auto newline = value.find('\n');
  if (newline == std::string::npos) {
    throw std::invalid_argument("not a node's collective views (no sequence number)");
  }
  return {std::stoull(value.substr(0, newline)), decode_views(value.substr(newline + 1))};
}

}  // namespace

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

store::Client& CollectiveExchange::client_for(const elastic::RoundInfo& round) {
  const std::string endpoint = round.master_addr + ":" + std::to_string(round.master_port);
  if (!client_ || client_endpoint_ != endpoint) {
    client_.reset();
    client_ = std::make_unique<store::Client>(workers_store_options(round, kExchangeTimeout));
    client_endpoint_ = endpoint;
  }
  return *client_;
}

void CollectiveExchange::send(store::Client& client, const elastic::RoundInfo& round,
                              const std::vector<RankView>& local) {
  const auto now = std::chrono::steady_clock::now();
  if (sent_round_ != round.round) {
    sent_round_ = round.round;
    sent_seq_ = 0;
    sent_content_.clear();
    steps_sent_at_ = {};
  }
  const bool steps_due = sent_seq_ == 0 || now - steps_sent_at_ >= kStepsEvery;
  std::string content = content_of(local);
  if (!steps_due && content == sent_content_) return;  // the others age what they have
  const std::string k = key(round.round, round.group_rank);
  // The views first, then the count that tells the others to read them: a count they see
  // always has its views in the store.
  client.set(k, std::to_string(sent_seq_ + 1) + "\n" + encode_views(local, steps_due));
  client.add(k + "/seq", 1);
  ++sent_seq_;
  sent_content_ = std::move(content);
  if (steps_due) steps_sent_at_ = now;
}

// This node's views out (when they changed), the other nodes' in (those that changed since
// last read), over the one connection; a failure drops it, to be made again next time.
void CollectiveExchange::exchange(const elastic::RoundInfo& round,
                                  const std::vector<RankView>& local) {
  std::map<int, Received> known;
  {
    std::lock_guard lock(mutex_);
    if (remote_round_ == round.round) known = remote_;
  }
  std::map<int, Received> received;
  try {
    store::Client& client = client_for(round);
    send(client, round, local);
    for (int g = 0; g < static_cast<int>(round.members.size()); ++g) {
      if (g == round.group_rank) continue;
      const std::string k = key(round.round, g);
      const auto count = static_cast<std::uint64_t>(client.add(k + "/seq", 0));
      if (count == 0) continue;  // nothing written yet
      auto old = known.find(g);
      if (old != known.end() && old->second.seq >= count) continue;  // unchanged
      auto [seq, views] = parse(client.get(k));
      if (old != known.end() && old->second.seq == seq) continue;  // read before
      for (RankView& view : views) view.remote = true;
      received[g] = {seq, std::move(views), std::chrono::steady_clock::now()};
    }
  } catch (const std::exception&) {
    client_.reset();
    throw;
  }
  std::lock_guard lock(mutex_);
  if (remote_round_ != round.round) remote_.clear();
  remote_round_ = round.round;
  for (auto& [g, r] : received) {
    // Step history comes every kStepsEvery: keep the last one received until then.
    if (auto old = remote_.find(g); old != remote_.end()) {
      for (RankView& view : r.views) {
        if (!view.recent_steps.empty()) continue;
        for (const RankView& before : old->second.views) {
          if (before.rank == view.rank) view.recent_steps = before.recent_steps;
        }
      }
    }
    remote_[g] = std::move(r);
  }
}

}  // namespace ddp::launcher
