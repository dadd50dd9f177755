#pragma once
// Agents share their ranks' collective records, so that a hang is judged over the whole job
// and a culprit on another node is named. Through the round's workers' store (the store at
// MASTER_ADDR:MASTER_PORT that some agent serves, with every rendezvous backend), linear in
// the nodes:
// - every node writes its views under ddprun/collectives/<round>/<group rank>, with its own
//   sequence number, and counts that number up under the same key + "/seq"; it writes only
//   when its views changed in more than their ages, and its ranks' step history only every
//   kStepsEvery;
// - one gatherer, the node of group rank 0, reads the others' counts (a few bytes) and their
//   views only when a count moved, judges the hang over the whole job and writes its verdict
//   under ddprun/collectives/<round>/verdict (a line and the ranks to blame as ranges), every
//   kGatherEvery, also when its own ranks have ended;
// - the other nodes read only that verdict; when it stops moving for kGathererQuiet (the
//   gatherer's agent is gone), each reads every node's views itself, as a fallback.
// A view is aged from when its sequence number was first read: a node that stopped writing
// (its ranks ended) grows older, as it would have said itself. One connection to the store,
// kept across exchanges and rounds (made again after a failure). On a thread of its own, so
// that a slow store never holds the agent's loop; the thread starts at the first publish of
// a round with several nodes (never for one node). Internal to the launcher.

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

#include "../diagnosis/collective_diagnosis.hpp"
#include "../diagnosis/rank_view.hpp"
#include "ddp/elastic/rendezvous.hpp"
#include "ddp/store/client.hpp"

namespace ddp::launcher {

// How long one store operation of the exchange may take.
inline constexpr std::chrono::milliseconds kExchangeTimeout{2000};
// A node's ranks' recent steps (for stragglers across nodes) are shared this often; stragglers
// are named at most once a minute anyway.
inline constexpr std::chrono::seconds kStepsEvery{10};
// The gatherer judges and writes its verdict this often (HangMonitor's tick at most).
inline constexpr std::chrono::milliseconds kGatherEvery{500};
// A verdict that has not moved for this long: the gatherer is gone, every node gathers.
inline constexpr std::chrono::seconds kGathererQuiet{4};
// A verdict names at most this many ranges of ranks to blame (a line, not the world).
inline constexpr std::size_t kVerdictRanges = 256;

class CollectiveExchange {
 public:
  // notice: one line for the console, when sharing fails (once per round). hang_timeout: what
  // the gatherer judges by (--hang_timeout; 0: no hang detection, verdicts say "no hang").
  CollectiveExchange(std::function<void(const std::string&)> notice,
                     std::chrono::milliseconds hang_timeout);
  ~CollectiveExchange();  // stops the thread, interrupting a request under way
  CollectiveExchange(const CollectiveExchange&) = delete;
  CollectiveExchange& operator=(const CollectiveExchange&) = delete;

  // This node's views now, and the round they belong to: sent on the exchange's thread
  // (started by the first call that has views to send). Call from one thread (the agent's
  // loop). Rounds of one node (group world size 1) are not shared.
  void publish(const elastic::RoundInfo& round, std::vector<RankView> local);

  // The other nodes' views of the round last published, as last received, aged to now: on the
  // gatherer (and on every node while it falls back); empty elsewhere.
  std::vector<RankView> remote() const;

  // Whether the job hangs, for this node's HangMonitor: judge_hang over views (this node's and
  // remote()) on the gatherer, a lone node, or while falling back; elsewhere the gatherer's
  // verdict (its headline and ranks to blame; rank lines for this node's ranks only).
  std::optional<CollectiveDiagnosis> judge(const std::vector<RankView>& views,
                                           double hang_timeout_s) const;

  // The key a node's views of a round are under; its sequence number is under key + "/seq".
  static std::string key(int round, int group_rank);
  // The key of the gatherer's verdict of a round (its count under key + "/seq").
  static std::string verdict_key(int round);

 private:
  struct Received {
    std::uint64_t seq = 0;  // the writer's sequence number of views
    std::vector<RankView> views;
    std::chrono::steady_clock::time_point at;  // when seq was first read: ages are as of then
  };

  void run();
  void exchange(const elastic::RoundInfo& round, const std::vector<RankView>& local,
                std::chrono::steady_clock::time_point local_at);
  // Drops the connection (after a failure): made again next time.
  void drop_client();
  // Writes this node's views when they changed in more than their ages (or the steps are due).
  void send(store::Client& client, const elastic::RoundInfo& round,
            const std::vector<RankView>& local);
  // The other nodes' views whose count moved since known.
  std::map<int, Received> gather(store::Client& client, const elastic::RoundInfo& round,
                                 const std::map<int, Received>& known);
  // The gatherer's verdict over every view, written for the others; none until every node's
  // views arrived (complete).
  void write_verdict(store::Client& client, const elastic::RoundInfo& round,
                     std::vector<RankView> all, bool complete);
  // The gatherer's verdict, when it moved; says whether it moved.
  bool read_verdict(store::Client& client, const elastic::RoundInfo& round);
  // The connection to the round's workers' store, made when there is none or it moved.
  store::Client& client_for(const elastic::RoundInfo& round);

  std::function<void(const std::string&)> notice_;
  const double hang_timeout_s_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::optional<elastic::RoundInfo> round_;       // the round of `local_`
  std::optional<std::vector<RankView>> local_;    // to send; taken by the thread
  std::chrono::steady_clock::time_point fed_at_;  // the last publish
  std::map<int, Received> remote_;                // by group rank, for remote_round_
  int remote_round_ = -1;
  int failed_round_ = -1;      // the round whose failure was said
  bool falling_back_ = false;  // no verdict for kGathererQuiet: this node gathers too
  struct Verdict {
    std::uint64_t seq = 0;
    std::optional<CollectiveDiagnosis> diagnosis;  // nullopt: no hang
  };
  std::optional<Verdict> verdict_;  // the gatherer's last, for remote_round_
  std::thread thread_;              // started by publish; empty until then

  // The exchange thread's own (no lock), but for client_, which the destructor interrupts.
  std::mutex client_mutex_;  // guards client_ (the pointer) against the destructor
  std::unique_ptr<store::Client> client_;
  std::string client_endpoint_;  // host:port of client_
  int sent_round_ = -1;
  std::uint64_t sent_seq_ = 0;  // the sequence number last written in sent_round_
  std::string sent_content_;    // what was written, ages and steps aside
  std::chrono::steady_clock::time_point steps_sent_at_;
  std::uint64_t verdict_seq_ = 0;  // the gatherer's verdicts written in sent_round_
  std::chrono::steady_clock::time_point
      verdict_moved_at_;  // a verdict last moved (or the round began)
};

}  // namespace ddp::launcher
