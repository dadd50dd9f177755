#pragma once
// Agents share their ranks' collective records, so that every node judges a hang over the
// whole job and names a culprit on another node. Through the round's workers' store (the
// store at MASTER_ADDR:MASTER_PORT that some agent serves, with every rendezvous backend):
// each node writes its views under ddprun/collectives/<round>/<group rank> and reads the
// others'. On a thread of its own, so that a slow store never holds the agent's loop; the
// thread starts at the first publish of a round with several nodes (never for one node).
// Internal to the launcher.

#include <chrono>
#include <condition_variable>
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

namespace ddp::launcher {

// How long one store operation of the exchange may take.
inline constexpr std::chrono::milliseconds kExchangeTimeout{2000};

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

  // The key a node's views of a round are under.
  static std::string key(int round, int group_rank);

 private:
  void run();
  void exchange(const elastic::RoundInfo& round, const std::vector<RankView>& local);

  std::function<void(const std::string&)> notice_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::optional<elastic::RoundInfo> round_;     // the round of `local_`
  std::optional<std::vector<RankView>> local_;  // to send; taken by the thread
  struct Received {
    std::vector<RankView> views;
    std::chrono::steady_clock::time_point at;
  };
  std::map<int, Received> remote_;  // by group rank, for round_
  int remote_round_ = -1;
  int failed_round_ = -1;  // the round whose failure was said
  std::thread thread_;     // started by publish; empty until then
};

}  // namespace ddp::launcher
