#include "watch/collective_exchange.hpp"

#include <algorithm>
#include <iterator>
#include <stdexcept>
#include <string_view>

#include "ddp/common/retry_pause.hpp"
#include "ddp/store/client.hpp"
#include "diagnosis/rank_view_json.hpp"
#include "watch/collective_keys.hpp"
#include "watch/shared_verdict.hpp"
#include "watch/workers_store_client.hpp"

namespace ddp::launcher {
namespace {

using Clock = std::chrono::steady_clock;

// A MULTI_GET of views asks for the views of at most this many ranks (whole nodes, at least
// one: a reply of a megabyte or two); one of progress for at most kProgressPerRequest nodes'
// (a few dozen bytes each).
constexpr std::size_t kRanksPerRequest = 1024;
constexpr std::size_t kProgressPerRequest = 4096;

double seconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

// "<seq><separator><text>", as written: the writer's sequence number and what it wrote.
std::pair<std::uint64_t, std::string_view> split_seq(std::string_view value, char separator) {
  const auto at = value.find(separator);
  if (at == std::string_view::npos) {
    throw std::invalid_argument("not what an agent shares (no sequence number)");
  }
  return {std::stoull(std::string(value.substr(0, at))), value.substr(at + 1)};
}

// Views received at `at`, aged to now.
std::vector<RankView> aged(std::vector<RankView> views, Clock::time_point at,
                           Clock::time_point now) {
  age_views(views, seconds_between(at, now));
  return views;
}

// The values of keys, at most `per_request` keys a request (every key exists).
std::vector<std::string> multi_get(store::Client& client, const std::vector<std::string>& keys,
                                   std::size_t per_request) {
  std::vector<std::string> values;
  values.reserve(keys.size());
  for (std::size_t i = 0; i < keys.size(); i += per_request) {
    const auto end =
        keys.begin() + static_cast<std::ptrdiff_t>(std::min(keys.size(), i + per_request));
    std::vector<std::string> some = client.multi_get(
        std::vector<std::string>(keys.begin() + static_cast<std::ptrdiff_t>(i), end));
    for (std::string& v : some) values.push_back(std::move(v));
  }
  return values;
}

// Views as held: their step history apart (copied only where it is needed).
std::vector<std::vector<StepInfo>> take_steps(std::vector<RankView>& views) {
  std::vector<std::vector<StepInfo>> steps;
  steps.reserve(views.size());
  for (RankView& view : views) steps.push_back(std::move(view.recent_steps));
  return steps;
}

// Step history comes every kStepsEvery: a rank's views without it keep the last one received.
void keep_steps(const std::vector<RankView>& views, std::vector<std::vector<StepInfo>>& steps,
                const std::vector<RankView>& before,
                const std::vector<std::vector<StepInfo>>& steps_before) {
  for (std::size_t i = 0; i < views.size(); ++i) {
    if (!steps[i].empty()) continue;
    for (std::size_t j = 0; j < before.size(); ++j) {
      if (before[j].rank == views[i].rank) steps[i] = steps_before[j];
    }
  }
}

}  // namespace

CollectiveExchange::CollectiveExchange(std::function<void(const std::string&)> notice,
                                       std::chrono::milliseconds hang_timeout)
    : notice_(std::move(notice)),
      hang_timeout_s_(static_cast<double>(hang_timeout.count()) / 1000.0) {}

CollectiveExchange::~CollectiveExchange() { stop(); }

void CollectiveExchange::stop() {
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
  drop_client();
}

std::string CollectiveExchange::key(int round, int group_rank) {
  return views_key(round, group_rank);
}

std::string CollectiveExchange::verdict_key(int round) { return launcher::verdict_key(round); }

void CollectiveExchange::publish(const elastic::RoundInfo& round, std::vector<RankView> local) {
  if (round.members.size() <= 1) return;
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return;
    round_ = round;
    local_ = std::move(local);
    fed_at_ = Clock::now();
  }
  // The thread starts with the first views to send: a one-node job never starts it.
  if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  wake_.notify_all();
}

std::vector<RankView> CollectiveExchange::remote() const {
  std::vector<RankView> all;
  append_remote(all);
  return all;
}

void CollectiveExchange::append_remote(std::vector<RankView>& all) const {
  std::lock_guard lock(mutex_);
  if (!round_ || remote_round_ != round_->round) return;
  const auto now = Clock::now();
  std::size_t count = all.size();
  for (const auto& [group_rank, received] : remote_) {
    if (received.current) count += received.views.size();
  }
  all.reserve(count);  // a thousand nodes' views while a hang holds: copied once
  for (const auto& [group_rank, received] : remote_) {
    if (!received.current) continue;
    const double age = seconds_between(received.at, now);
    for (std::size_t i = 0; i < received.views.size(); ++i) {
      all.push_back(received.views[i]);
      age_view(all.back(), age);
      if (!hung_) all.back().recent_steps = received.steps[i];
    }
  }
}

std::optional<CollectiveDiagnosis> CollectiveExchange::judge(const std::vector<RankView>& views,
                                                             double hang_timeout_s) const {
  std::optional<CollectiveDiagnosis> verdict;
  {
    std::lock_guard lock(mutex_);
    if (!round_ || round_->members.size() <= 1) return judge_hang(views, hang_timeout_s);
    if (!failing_) {
      if (!verdict_ || remote_round_ != round_->round || !*verdict_) return std::nullopt;
      verdict = *verdict_;
    }
  }
  std::vector<RankView> local;  // this node's ranks (the gatherer's views hold the others' too)
  std::copy_if(views.begin(), views.end(), std::back_inserter(local),
               [](const RankView& v) { return !v.remote; });
  // Cut off from the others: what this node's ranks say (a part of the others' would blame
  // ranks wrongly).
  if (!verdict) return judge_hang(local, hang_timeout_s);
  verdict->ranks = diagnose(std::move(local)).ranks;
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
    const bool gatherer = round_->group_rank == 0 || gathering_;
    if (!fed && (!gatherer || now - fed_at_ < 2 * kGatherEvery)) continue;
    if (now < retry_at_) continue;  // backing off after a failure
    const elastic::RoundInfo round = *round_;
    lock.unlock();
    bool failed = false;
    try {
      exchange(round, local, local_at);
      retry_pause_ = std::chrono::milliseconds(0);
      failing_since_.reset();
    } catch (const std::exception& e) {
      failed = true;
      // Try again after a pause that doubles, with jitter: a thousand agents whose first
      // exchange found the store busy do not all come back on the next tick.
      retry_pause_ = std::clamp(retry_pause_ * 2, kGatherEvery, kRetryLast);
      const auto failed_at = Clock::now();
      retry_at_ = failed_at + jittered(retry_pause_);
      if (!failing_since_) failing_since_ = failed_at;
      // A store that answers late is busy: said only once that lasts (kBusyGrace).
      const bool late = dynamic_cast<const store::StoreTimeout*>(&e) != nullptr;
      const bool lasting = !late || failed_at - *failing_since_ >= kBusyGrace;
      lock.lock();
      const bool said = failed_round_ == round.round || !fed || !lasting;  // unfed: job over?
      if (fed && lasting) failed_round_ = round.round;
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
    failing_ = failed;
  }
}

store::Client& CollectiveExchange::client_for(const elastic::RoundInfo& round) {
  const std::string endpoint = round.master_addr + ":" + std::to_string(round.master_port);
  if (!client_ || client_endpoint_ != endpoint) {
    drop_client();
    store::ClientOptions options = workers_store_options(round, kExchangeTimeout);
    // An agent's store speaks both dialects (a probe would pick 1.x); only 2.x reads and
    // writes many keys in one request.
    options.dialect = store::Dialect::V2;
    auto client = std::make_unique<store::Client>(options);
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

void CollectiveExchange::begin_round(const elastic::RoundInfo& round) {
  round_no_ = round.round;
  acting_ = round.group_rank == 0;
  nodes_.assign(round.members.size(), Node{});
  next_views_ = 0;
  judged_.reset();
  writer_rank_ = 0;
  verdict_count_ = 0;
  verdict_moved_at_ = Clock::now();
  std::lock_guard lock(mutex_);
  remote_.clear();
  verdict_.reset();
  remote_round_ = round.round;
  gathering_ = acting_;
  hung_ = false;
}

// This node's views out (when they changed); on the gatherer every node's progress in, the
// views it needs, and its verdict out; elsewhere the gatherer's verdict in. Over the one
// connection, which a failure drops, to be made again next time.
void CollectiveExchange::exchange(const elastic::RoundInfo& round,
                                  const std::vector<RankView>& local, Clock::time_point local_at) {
  if (round_no_ != round.round) begin_round(round);
  try {
    store::Client& client = client_for(round);
    writer_.write(client, round, local);
    if (round.group_rank != 0) follow(client, round);
    if (acting_) gather(client, round, local, local_at);
  } catch (const std::exception&) {
    drop_client();
    throw;
  }
}

void CollectiveExchange::follow(store::Client& client, const elastic::RoundInfo& round) {
  const int self = round.group_rank;
  const auto now = Clock::now();
  const std::int64_t count = client.add(verdict_count_key(round.round), 0);
  if (count != verdict_count_) {
    verdict_count_ = count;
    SharedVerdict verdict = decode_verdict(client.get(launcher::verdict_key(round.round)));
    if (acting_ && verdict.by < self) {
      acting_ = false;  // the node it replaced (or one before it) gathers again
      judged_.reset();
      for (Node& node : nodes_) node.held = 0;
      std::lock_guard lock(mutex_);
      remote_.clear();
      gathering_ = false;
      hung_ = false;
    }
    if (!acting_) {
      writer_rank_ = verdict.by;
      verdict_moved_at_ = now;
      std::lock_guard lock(mutex_);
      verdict_ = std::move(verdict.diagnosis);
    }
  }
  if (acting_) return;
  // The group ranks after the verdict's writer take over one after the other.
  const int nodes = static_cast<int>(round.members.size());
  int distance = (self - writer_rank_ + nodes) % nodes;
  if (distance == 0) distance = nodes;
  if (now - verdict_moved_at_ >= distance * kGathererQuiet) {
    acting_ = true;
    std::lock_guard lock(mutex_);
    gathering_ = true;
    verdict_.reset();
  }
}

void CollectiveExchange::gather(store::Client& client, const elastic::RoundInfo& round,
                                const std::vector<RankView>& local, Clock::time_point local_at) {
  read_progress(client, round);
  const auto now = Clock::now();
  // Whether the job could hang, from every node's progress aged to now (this node's from its
  // views): judged once every node's progress reached the gatherer, as a verdict over some of
  // the job would call the ranks of a node not heard from yet absent, or miss them; but for
  // the gatherers this one replaced, which may be gone before they wrote any.
  const int self = round.group_rank;
  const int nodes = static_cast<int>(nodes_.size());
  auto replaced = [&](int g) {
    return (g - writer_rank_ + nodes) % nodes < (self - writer_rank_ + nodes) % nodes;
  };
  bool complete = true;
  std::vector<NodeProgress> progress;
  progress.reserve(nodes_.size());
  for (int g = 0; g < nodes; ++g) {
    if (g == self) continue;
    const Node& node = nodes_[static_cast<std::size_t>(g)];
    if (node.seq == 0) {
      if (!replaced(g)) complete = false;
      continue;
    }
    progress.push_back(node.progress);
    age_progress(progress.back(), seconds_between(node.at, now));
  }
  progress.push_back(progress_of(local));
  age_progress(progress.back(), seconds_between(local_at, now));
  std::vector<std::uint64_t> hung;
  if (hang_timeout_s_ > 0 && complete) hung = hung_communicators(progress, hang_timeout_s_);

  const bool hang_possible = !hung.empty();
  if (hang_possible && !hung_) drop_steps();  // nothing steps now: held for nothing
  if (read_views(client, round, views_to_read(round, hang_possible), !hang_possible)) {
    views_changed_ = true;
  }
  std::optional<CollectiveDiagnosis> d;
  if (!hang_possible) {
    judged_.reset();
  } else if (views_behind(round)) {
    if (judged_) d = judged_->diagnosis;  // reading the rest: the last verdict stands
  } else {
    d = verdict_over_views(local, local_at, std::move(hung));
  }
  write_verdict(client, round, d);
  std::lock_guard lock(mutex_);
  for (auto& [g, received] : remote_) {
    received.current = received.seq >= nodes_[static_cast<std::size_t>(g)].content_seq;
  }
  verdict_ = std::move(d);
  hung_ = hang_possible;
}

void CollectiveExchange::read_progress(store::Client& client, const elastic::RoundInfo& round) {
  auto take = [this](int g, std::string_view value, Clock::time_point at) {
    if (value.empty()) return;  // made by the gatherer: nothing written yet
    Node& node = nodes_[static_cast<std::size_t>(g)];
    auto [seq, rest] = split_seq(value, ' ');
    if (seq <= node.seq) return;  // read before
    auto [content_seq, rest2] = split_seq(rest, ' ');
    auto [ranks, text] = split_seq(rest2, ' ');
    node.progress = decode_progress(text);
    node.seq = seq;
    node.content_seq = content_seq;
    node.ranks = static_cast<std::size_t>(ranks);
    node.at = at;
  };
  std::vector<int> present;
  std::vector<std::string> keys;
  for (int g = 0; g < static_cast<int>(nodes_.size()); ++g) {
    if (g == round.group_rank) continue;
    Node& node = nodes_[static_cast<std::size_t>(g)];
    if (node.present) {
      present.push_back(g);
      keys.push_back(progress_key(round.round, g));
      continue;
    }
    // Once a round a node: its key made (empty) unless it was written, so that one MULTI_GET,
    // which waits for every key it asks for, reads every node's from now on.
    take(g, client.compare_set(progress_key(round.round, g), "", ""), Clock::now());
    node.present = true;
  }
  const std::vector<std::string> values = multi_get(client, keys, kProgressPerRequest);
  const auto now = Clock::now();
  for (std::size_t i = 0; i < present.size(); ++i) take(present[i], values[i], now);
}

std::vector<int> CollectiveExchange::views_to_read(const elastic::RoundInfo& round,
                                                   bool hang_possible) {
  std::vector<int> behind;
  std::size_t ranks = 0;
  const std::size_t n = nodes_.size();
  const std::size_t budget = hang_possible ? kRanksPerHangTick : kRanksPerTick;
  for (std::size_t i = 0; i < n && ranks < budget; ++i) {
    const std::size_t g = (next_views_ + i) % n;
    // While a hang is possible, only views that changed in more than their steps (nothing
    // steps then, but each node's last steps may come after the hang began).
    const std::uint64_t wanted = hang_possible ? nodes_[g].content_seq : nodes_[g].seq;
    if (static_cast<int>(g) == round.group_rank || wanted <= nodes_[g].held) continue;
    behind.push_back(static_cast<int>(g));
    ranks += std::max<std::size_t>(nodes_[g].ranks, 1);
  }
  if (!behind.empty()) next_views_ = (static_cast<std::size_t>(behind.back()) + 1) % n;
  return behind;
}

bool CollectiveExchange::views_behind(const elastic::RoundInfo& round) const {
  for (std::size_t g = 0; g < nodes_.size(); ++g) {
    if (static_cast<int>(g) != round.group_rank && nodes_[g].content_seq > nodes_[g].held) {
      return true;
    }
  }
  return false;
}

void CollectiveExchange::drop_steps() {
  std::lock_guard lock(mutex_);
  for (auto& [g, received] : remote_) {
    for (auto& steps : received.steps) std::vector<StepInfo>().swap(steps);
  }
}

bool CollectiveExchange::read_views(store::Client& client, const elastic::RoundInfo& round,
                                    const std::vector<int>& nodes, bool with_steps) {
  bool changed = false;
  // A request for kRanksPerRequest ranks' views at most, each taken in before the next, so that
  // what was read stays read should a later request fail.
  for (std::size_t first = 0; first < nodes.size();) {
    std::size_t end = first, ranks = 0;
    std::vector<std::string> keys;
    while (end < nodes.size() && (keys.empty() || ranks < kRanksPerRequest)) {
      ranks += std::max<std::size_t>(nodes_[static_cast<std::size_t>(nodes[end])].ranks, 1);
      keys.push_back(views_key(round.round, nodes[end++]));
    }
    const std::vector<std::string> values = client.multi_get(keys);
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (take_views(nodes[first + i], values[i], with_steps)) changed = true;
    }
    first = end;
  }
  return changed;
}

bool CollectiveExchange::take_views(int g, const std::string& value, bool with_steps) {
  Node& node = nodes_[static_cast<std::size_t>(g)];
  auto [seq, text] = split_seq(value, '\n');
  if (seq <= node.held) return false;
  const auto now = Clock::now();
  std::vector<RankView> views = decode_views(std::string(text));
  for (RankView& view : views) view.remote = true;
  if (seq > node.seq) {  // written since its progress was read: newer still
    node.seq = seq;
    node.content_seq = seq;  // whether it changed is not known: as if it did
    node.progress = progress_of(views);
    node.at = now;
    node.ranks = views.size();
  }
  const bool changed = node.held < node.content_seq;
  node.held = seq;
  std::vector<std::vector<StepInfo>> steps = take_steps(views);
  if (!with_steps) steps.assign(views.size(), {});
  Received r{seq, std::move(views), std::move(steps), seq == node.seq ? node.at : now, true};
  std::lock_guard lock(mutex_);
  if (auto old = remote_.find(g); old != remote_.end()) {
    keep_steps(r.views, r.steps, old->second.views, old->second.steps);
  }
  remote_[g] = std::move(r);
  return changed;
}

std::optional<CollectiveDiagnosis> CollectiveExchange::verdict_over_views(
    const std::vector<RankView>& local, Clock::time_point local_at,
    std::vector<std::uint64_t> hung) {
  const auto now = Clock::now();
  // While nothing changed but the ages, the last judgement stands (kVerdictRefresh: its
  // durations); one that found no hang where the progress says one is possible is redone.
  if (judged_ && !views_changed_ && judged_->hung == hung && judged_->diagnosis &&
      now - judged_->at <
          std::max<Clock::duration>(kVerdictRefresh, kRejudgeAfter * judged_->took)) {
    return judged_->diagnosis;
  }
  std::vector<RankView> all = aged(local, local_at, now);
  {
    std::lock_guard lock(mutex_);
    std::size_t count = all.size();
    for (const auto& [g, r] : remote_) count += r.views.size();
    all.reserve(count);
    for (const auto& [g, r] : remote_) {
      const double age = seconds_between(r.at, now);
      for (const RankView& view : r.views) age_view(all.emplace_back(view), age);
    }
  }
  views_changed_ = false;
  std::optional<CollectiveDiagnosis> d = judge_hang(all, hang_timeout_s_, false);
  judged_ = Judged{std::move(hung), now, Clock::now() - now, std::move(d)};
  return judged_->diagnosis;
}

void CollectiveExchange::write_verdict(store::Client& client, const elastic::RoundInfo& round,
                                       const std::optional<CollectiveDiagnosis>& d) {
  client.set(launcher::verdict_key(round.round), encode_verdict({round.group_rank, d}));
  client.add(verdict_count_key(round.round), 1);
}

}  // namespace ddp::launcher
