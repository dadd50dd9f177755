#include "collective_exchange.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "../diagnosis/rank_view_json.hpp"
#include "ddp/store/client.hpp"
#include "workers_store_client.hpp"

namespace ddp::launcher {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

// What a node's views say, ages aside: while only their ages change, nothing is written (the
// others age what they have).
void zero_ages(std::vector<RankView>& views) {
  for (RankView& v : views) {
    if (v.since_finished_s) v.since_finished_s = 0.0;
    if (v.pending) v.pending->age_s = 0;
    if (v.last) v.last->age_s = 0;
    if (v.p2p) v.p2p->age_s = 0;
    zero_ages(v.lanes);
  }
}

std::string content_of(std::vector<RankView> views) {
  zero_ages(views);
  return encode_views(views, false);
}

// "<seq>\n<text>", as written: the writer's sequence number and what it wrote.
std::pair<std::uint64_t, std::string> split_seq(const std::string& value) {
  const auto newline = value.find('\n');
  if (newline == std::string::npos) {
    throw std::invalid_argument("not what an agent shares (no sequence number)");
  }
  return {std::stoull(value.substr(0, newline)), value.substr(newline + 1)};
}

// Ranks as [first, last] ranges, at most kVerdictRanges of them.
nlohmann::json rank_ranges(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  nlohmann::json ranges = nlohmann::json::array();
  for (std::size_t i = 0; i < ranks.size() && ranges.size() < kVerdictRanges;) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    ranges.push_back({ranks[i], ranks[j]});
    i = j + 1;
  }
  return ranges;
}

std::string encode_verdict(const std::optional<CollectiveDiagnosis>& d) {
  nlohmann::json j = {{"hung", d.has_value()}};
  if (d) {
    j["headline"] = d->headline;
    j["desync"] = d->desync;
    j["blamed"] = rank_ranges(d->blamed);
    if (d->collective) j["collective"] = *d->collective;
  }
  return j.dump();
}

std::optional<CollectiveDiagnosis> decode_verdict(const std::string& text) {
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    if (!j.at("hung").get<bool>()) return std::nullopt;
    CollectiveDiagnosis d;
    d.headline = j.at("headline").get<std::string>();
    d.desync = j.at("desync").get<bool>();
    for (const auto& range : j.at("blamed")) {
      for (int r = range.at(0).get<int>(); r <= range.at(1).get<int>(); ++r) d.blamed.push_back(r);
    }
    if (j.contains("collective")) d.collective = j["collective"].get<std::uint64_t>();
    return d;
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(std::string("not the gatherer's verdict: ") + e.what());
  }
}

// Views received at `at`, aged to now.
std::vector<RankView> aged(std::vector<RankView> views, Clock::time_point at,
                           Clock::time_point now) {
  age_views(views, seconds_between(at, now));
  return views;
}

}  // namespace

CollectiveExchange::CollectiveExchange(std::function<void(const std::string&)> notice,
                                       std::chrono::milliseconds hang_timeout)
    : notice_(std::move(notice)),
      hang_timeout_s_(static_cast<double>(hang_timeout.count()) / 1000.0) {}

CollectiveExchange::~CollectiveExchange() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  {
    // A request to a store that no longer answers (its agent is ending) would hold the join
    // for up to kExchangeTimeout.
    std::lock_guard lock(client_mutex_);
    if (client_) client_->interrupt();
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::string CollectiveExchange::key(int round, int group_rank) {
  return "ddprun/collectives/" + std::to_string(round) + "/" + std::to_string(group_rank);
}

std::string CollectiveExchange::verdict_key(int round) {
  return "ddprun/collectives/" + std::to_string(round) + "/verdict";
}

void CollectiveExchange::publish(const elastic::RoundInfo& round, std::vector<RankView> local) {
  if (round.members.size() <= 1) return;
  {
    std::lock_guard lock(mutex_);
    round_ = round;
    local_ = std::move(local);
    fed_at_ = Clock::now();
  }
  // The thread starts with the first views to send: a one-node job never starts it.
  if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  wake_.notify_all();
}

std::vector<RankView> CollectiveExchange::remote() const {
  std::lock_guard lock(mutex_);
  std::vector<RankView> all;
  if (!round_ || remote_round_ != round_->round) return all;
  const auto now = Clock::now();
  for (const auto& [group_rank, received] : remote_) {
    std::vector<RankView> views = aged(received.views, received.at, now);
    all.insert(all.end(), views.begin(), views.end());
  }
  return all;
}

std::optional<CollectiveDiagnosis> CollectiveExchange::judge(const std::vector<RankView>& views,
                                                             double hang_timeout_s) const {
  std::optional<CollectiveDiagnosis> verdict;
  {
    std::lock_guard lock(mutex_);
    const bool follows =
        round_ && round_->members.size() > 1 && round_->group_rank != 0 && !falling_back_;
    if (!follows) return judge_hang(views, hang_timeout_s);
    if (!verdict_ || remote_round_ != round_->round || !verdict_->diagnosis) return std::nullopt;
    verdict = verdict_->diagnosis;
  }
  verdict->ranks = diagnose(views).ranks;  // this node's ranks
  return verdict;
}

void CollectiveExchange::run() {
  std::unique_lock lock(mutex_);
  std::vector<RankView> local;
  Clock::time_point local_at;
  while (true) {
    wake_.wait_for(lock, kGatherEvery, [this] { return stopping_ || local_.has_value(); });
    if (stopping_) return;
    const auto now = Clock::now();
    const bool fed = local_.has_value();
    if (fed) {
      local = std::move(*local_);
      local_.reset();
      local_at = now;
    }
    // Between publishes only the gatherer goes on, once they stopped (its ranks ended while
    // the others' may wait in a collective): the others still need its verdict.
    if (!fed && (round_->group_rank != 0 || now - fed_at_ < 2 * kGatherEvery)) continue;
    const elastic::RoundInfo round = *round_;
    lock.unlock();
    try {
      exchange(round, local, local_at);
    } catch (const std::exception& e) {
      lock.lock();
      const bool said = failed_round_ == round.round || !fed;  // unfed: the job may be over
      if (fed) failed_round_ = round.round;
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
    drop_client();
    auto client = std::make_unique<store::Client>(workers_store_options(round, kExchangeTimeout));
    std::lock_guard lock(client_mutex_);
    client_ = std::move(client);
    client_endpoint_ = endpoint;
  }
  return *client_;
}

void CollectiveExchange::drop_client() {
  std::lock_guard lock(client_mutex_);
  client_.reset();
}

void CollectiveExchange::send(store::Client& client, const elastic::RoundInfo& round,
                              const std::vector<RankView>& local) {
  const auto now = Clock::now();
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

std::map<int, CollectiveExchange::Received> CollectiveExchange::gather(
    store::Client& client, const elastic::RoundInfo& round, const std::map<int, Received>& known) {
  std::map<int, Received> received;
  for (int g = 0; g < static_cast<int>(round.members.size()); ++g) {
    if (g == round.group_rank) continue;
    const std::string k = key(round.round, g);
    const auto count = static_cast<std::uint64_t>(client.add(k + "/seq", 0));
    if (count == 0) continue;  // nothing written yet
    auto old = known.find(g);
    if (old != known.end() && old->second.seq >= count) continue;  // unchanged
    auto [seq, text] = split_seq(client.get(k));
    if (old != known.end() && old->second.seq == seq) continue;  // read before
    std::vector<RankView> views = decode_views(text);
    for (RankView& view : views) view.remote = true;
    received[g] = {seq, std::move(views), Clock::now()};
  }
  return received;
}

void CollectiveExchange::write_verdict(store::Client& client, const elastic::RoundInfo& round,
                                       std::vector<RankView> all, bool complete) {
  std::optional<CollectiveDiagnosis> d;
  if (hang_timeout_s_ > 0 && complete) d = judge_hang(all, hang_timeout_s_);
  const std::string k = verdict_key(round.round);
  client.set(k, std::to_string(verdict_seq_ + 1) + "\n" + encode_verdict(d));
  client.add(k + "/seq", 1);
  ++verdict_seq_;
}

bool CollectiveExchange::read_verdict(store::Client& client, const elastic::RoundInfo& round) {
  const std::string k = verdict_key(round.round);
  const auto count = static_cast<std::uint64_t>(client.add(k + "/seq", 0));
  if (count == 0 || count <= verdict_seq_) return false;
  auto [seq, text] = split_seq(client.get(k));
  if (seq <= verdict_seq_) return false;
  Verdict verdict{seq, decode_verdict(text)};
  verdict_seq_ = seq;
  verdict_moved_at_ = Clock::now();
  std::lock_guard lock(mutex_);
  if (remote_round_ != round.round) {
    remote_.clear();
    remote_round_ = round.round;
  }
  verdict_ = std::move(verdict);
  return true;
}

// This node's views out (when they changed); on the gatherer (or falling back) the other
// nodes' in (those that changed since last read), elsewhere the gatherer's verdict; over the
// one connection, which a failure drops, to be made again next time.
void CollectiveExchange::exchange(const elastic::RoundInfo& round,
                                  const std::vector<RankView>& local, Clock::time_point local_at) {
  const bool gatherer = round.group_rank == 0;
  bool gatherer_complete = true;
  const auto now = Clock::now();
  if (sent_round_ != round.round) {  // a new round: everything counts from the start
    sent_round_ = round.round;
    sent_seq_ = 0;
    sent_content_.clear();
    verdict_seq_ = 0;
    verdict_moved_at_ = now;
  }
  std::map<int, Received> known;
  {
    std::lock_guard lock(mutex_);
    if (remote_round_ == round.round) known = remote_;
  }
  std::map<int, Received> received;
  bool falling_back = false;
  try {
    store::Client& client = client_for(round);
    send(client, round, local);
    if (!gatherer) {
      read_verdict(client, round);
      falling_back = Clock::now() - verdict_moved_at_ >= kGathererQuiet;
    }
    if (gatherer || falling_back) received = gather(client, round, known);
  } catch (const std::exception&) {
    drop_client();
    throw;
  }
  std::vector<RankView> all;
  {
    std::lock_guard lock(mutex_);
    if (remote_round_ != round.round) {
      remote_.clear();
      verdict_.reset();
    }
    remote_round_ = round.round;
    falling_back_ = falling_back;
    if (!gatherer && !falling_back) remote_.clear();  // the gatherer's verdict says it all
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
    // The gatherer judges once every node's views reached it: a verdict over some of the
    // job would call the ranks of a node not heard from yet absent, or miss them.
    if (gatherer && remote_.size() + 1 < round.members.size()) gatherer_complete = false;
    if (gatherer) {
      all = aged(local, local_at, now);
      for (const auto& [g, r] : remote_) {
        std::vector<RankView> views = aged(r.views, r.at, now);
        all.insert(all.end(), views.begin(), views.end());
      }
    }
  }
  if (!gatherer) return;
  try {
    write_verdict(*client_, round, std::move(all), gatherer_complete);
  } catch (const std::exception&) {
    drop_client();
    throw;
  }
}

}  // namespace ddp::launcher
