#pragma once
// Agents share their ranks' collective records, so that every node judges a hang over the
// whole job and names a culprit on another node. Through the round's workers' store (the
// store at MASTER_ADDR:MASTER_PORT that some agent serves, with every rendezvous backend):
// each node writes its views under ddprun/collectives/<round>/<group rank>, with its own
// sequence number, and counts that number up under the same key + "/seq"; the others read the
// count (a few bytes) and the views only when it moved. A node writes only when its views
// changed in more than their ages, and its ranks' step history only every kStepsEvery. A view
// is aged from when its sequence number was first read: a node that stopped writing (its
// ranks ended) grows older, as it would have said itself. One connection to the store, kept
// across exchanges and rounds (made again after a failure). On a thread of its own, so that
// a slow store never holds the agent's loop; the thread starts at the first publish of a
// round with several nodes (never for one node). Internal to the launcher.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "../diagnosis/rank_view.hpp"
#include "ddp/elastic/rendezvous.hpp"
#include "ddp/store/client.hpp"

namespace ddp::launcher {

// How long one store operation of the exchange may take.
inline constexpr std::chrono::milliseconds kExchangeTimeout{2000};
// A node's ranks' recent steps (for stragglers across nodes) are shared this often; stragglers
// are named at most once a minute anyway.
inline constexpr std::chrono::seconds kStepsEvery{10};

class CollectiveExchange {
 public:
  // notice: one line for the console, when sharing fails (once per round).
  explicit CollectiveExchange(std::function<void(const std::string&)> notice);
  ~CollectiveExchange();  // stops the thread (bounded by kExchangeTimeout)
  CollectiveExchange(const CollectiveExchange&) = delete;
  CollectiveExchange& operator=(const CollectiveExchange&) = delete;

  // This node's views now, and the round they belong to: sent on the exchange's thread
  // (started by the first call that has views to send). Call from one thread (the agent's
  // loop). Rounds of one node (group world size 1) are not shared.
  void publish(const elastic::RoundInfo& round, std::vector<RankView> local);

  // The other nodes' views of the round last published, as last received, aged to now.
  std::vector<RankView> remote() const;

  // The key a node's views of a round are under; its sequence number is under key + "/seq".
  static std::string key(int round, int group_rank);

 private:
  void run();
  void exchange(const elastic::RoundInfo& round, const std::vector<RankView>& local);
  // Writes this node's views when they changed in more than their ages (or the steps are due).
  void send(store::Client& client, const elastic::RoundInfo& round,
            const std::vector<RankView>& local);
  // The connection to the round's workers' store, made when there is none or it moved.
  store::Client& client_for(const elastic::RoundInfo& round);

  std::function<void(const std::string&)> notice_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::optional<elastic::RoundInfo> round_;     // the round of `local_`
  std::optional<std::vector<RankView>> local_;  // to send; taken by the thread
  struct Received {
    std::uint64_t seq = 0;  // the writer's sequence number of views
    std::vector<RankView> views;
    std::chrono::steady_clock::time_point
        at;  // when seq was first read: views' ages are as of then
  };
  std::map<int, Received> remote_;  // by group rank, for round_
  int remote_round_ = -1;
  int failed_round_ = -1;  // the round whose failure was said
  std::thread thread_;     // started by publish; empty until then

  // The exchange thread's own (no lock).
  std::unique_ptr<store::Client> client_;
  std::string client_endpoint_;  // host:port of client_
  int sent_round_ = -1;
  std::uint64_t sent_seq_ = 0;  // the sequence number last written in sent_round_
  std::string sent_content_;    // what was written, ages and steps aside
  std::chrono::steady_clock::time_point steps_sent_at_;
};

}  // namespace ddp::launcher
