#pragma once
// Agents share their ranks' collective records, so that a hang is judged over the whole job
// and a culprit on another node is named. Through the round's workers' store (the store at
// MASTER_ADDR:MASTER_PORT that some agent serves, with every rendezvous backend), with one
// gatherer whose work a tick is a few requests, whatever the number of nodes:
// - every node writes its views under ddprun/collectives/<round>/<group rank> and, in the same
//   request, their progress under key + "/progress" (node_progress.hpp: per communicator, how
//   long ago its ranks last finished a collective and how long the longest waiter among them
//   has waited; a few bytes), both with its own sequence number; it writes only when its views
//   changed in more than their ages, and its ranks' step history only every kStepsEvery
//   (ViewsWriter);
// - one gatherer, at first the node of group rank 0, reads every node's progress in one request
//   every kGatherEvery, and from those alone knows whether the job could hang. Only then does
//   it read the views that changed since it read them (a few requests, kRanksPerHangTick
//   ranks' a tick at most) and, holding every rank's, judge the hang over them all (judge_hang:
//   the same verdict and names as over views read all along; judged again only when a view
//   changed, or for its durations after kVerdictRefresh). Otherwise it reads the changed views
//   of at most kRanksPerTick ranks a tick, in turn (what kill -USR1 and stragglers on its node
//   see of the others). It writes its verdict (shared_verdict.hpp) under
//   ddprun/collectives/<round>/verdict every kGatherEvery, also when its own ranks have ended;
// - the other nodes read only that verdict. When it stops moving for kGathererQuiet (its
//   writer's agent is gone), the next group rank takes over as the gatherer (the one after
//   that after twice as long, and so on), and the others go on reading the one verdict; a
//   gatherer that reads a verdict of a lower group rank (the node it replaced is back) follows
//   it again.
// A view or progress is aged from when its sequence number was first read: a node that
// stopped writing (its ranks ended) grows older, as it would have said itself. Every node
// prints the verdict with its own ranks' lines; one that cannot reach the store judges its own
// ranks. One connection to the store, kept across exchanges and rounds (made again after a
// failure), in the 2.x dialect (an agent's store speaks both; only 2.x reads or writes many
// keys in one request). On a thread of its own, so that a slow store never holds the agent's
// loop; the thread starts at the first publish of a round with several nodes (never for one
// node). Internal to the launcher.

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

#include "ddp/elastic/rendezvous.hpp"
#include "ddp/store/client.hpp"
#include "diagnosis/collective_diagnosis.hpp"
#include "diagnosis/node_progress.hpp"
#include "diagnosis/rank_view.hpp"
#include "watch/shared_verdict.hpp"
#include "watch/views_writer.hpp"

namespace ddp::launcher {

// How long one store operation of the exchange may take.
inline constexpr std::chrono::milliseconds kExchangeTimeout{2000};
// The gatherer judges and writes its verdict this often (HangMonitor's tick at most).
inline constexpr std::chrono::milliseconds kGatherEvery{500};
// A verdict that has not moved for this long: its writer is gone, the next group rank gathers.
inline constexpr std::chrono::seconds kGathererQuiet{4};
// After failed exchanges the thread waits at most this long (with jitter) before the next.
inline constexpr std::chrono::milliseconds kRetryLast{8000};
// While no hang is possible, the gatherer reads the changed views of at most this many ranks a
// tick (whole nodes, at least one); while one is, at most kRanksPerHangTick (its verdict waits
// until it holds every rank's: a few ticks at 100,000 ranks), so that a tick stays short.
inline constexpr std::size_t kRanksPerTick = 64;
inline constexpr std::size_t kRanksPerHangTick = 16384;
// While a hang holds and no view changes, the verdict is judged again this often (for the
// durations it gives), or kRejudgeAfter times as long as judging took when that is longer
// (judging every rank then takes under 0.2 % of a core, however many); at once when a view or
// the hung communicators changed.
inline constexpr std::chrono::seconds kVerdictRefresh{5};
inline constexpr int kRejudgeAfter = 500;

class CollectiveExchange {
 public:
  // notice: one line for the console, when sharing fails (once per round). hang_timeout: what
  // the gatherer judges by (--hang_timeout; 0: no hang detection, verdicts say "no hang").
  CollectiveExchange(std::function<void(const std::string&)> notice,
                     std::chrono::milliseconds hang_timeout);
  ~CollectiveExchange();  // stop()
  // Stops the thread, interrupting a request under way, and closes its connection to the
  // store (which may be this agent's own: its host then waits only for the other agents).
  // Later publishes are dropped. Idempotent.
  void stop();
  CollectiveExchange(const CollectiveExchange&) = delete;
  CollectiveExchange& operator=(const CollectiveExchange&) = delete;

  // This node's views now, and the round they belong to: sent on the exchange's thread
  // (started by the first call that has views to send). Call from one thread (the agent's
  // loop). Rounds of one node (group world size 1) are not shared.
  void publish(const elastic::RoundInfo& round, std::vector<RankView> local);

  // The other nodes' views of the round last published that the gatherer holds as they are
  // now (none it knows to have changed since it read them), aged to now: every node's while a
  // hang is possible (then without their step history: nothing steps), else those read lately;
  // empty on the other nodes.
  std::vector<RankView> remote() const;
  // The same, appended to views (one allocation for the whole job's views).
  void append_remote(std::vector<RankView>& views) const;

  // Whether the job hangs, for this node's HangMonitor: the gatherer's verdict (its headline
  // and ranks to blame; on the gatherer as judged on the exchange's thread), with rank lines
  // for this node's ranks (those of views not remote); on a lone node, or while this node
  // cannot reach the store, judge_hang over views.
  std::optional<CollectiveDiagnosis> judge(const std::vector<RankView>& views,
                                           double hang_timeout_s) const;

  // The key a node's views of a round are under (collective_keys.hpp).
  static std::string key(int round, int group_rank);
  // The key of the gatherer's verdict of a round (its count under key + "/seq").
  static std::string verdict_key(int round);

 private:
  struct Received {
    std::uint64_t seq = 0;                     // the writer's sequence number of views
    std::vector<RankView> views;               // without their step history, which is in `steps`
    std::vector<std::vector<StepInfo>> steps;  // each view's recent steps
    std::chrono::steady_clock::time_point at;  // when seq was first read: ages are as of then
    bool current = true;  // the node's views have not changed since (but for their steps)
  };
  // Another node as the gatherer knows it from its progress.
  struct Node {
    bool present = false;   // its progress key exists (made empty by the gatherer if need be)
    std::uint64_t seq = 0;  // the sequence number of its last progress read (0: none yet)
    std::uint64_t content_seq = 0;  // the last write that changed its views (but for steps)
    NodeProgress progress;          // as of `at`
    std::chrono::steady_clock::time_point at;  // when seq was first read
    std::uint64_t held = 0;                    // the sequence number of its views held
    std::size_t ranks = 0;                     // how many ranks its views hold
  };
  // The gatherer's last judgement over the views, kept while nothing it rests on changed.
  struct Judged {
    std::vector<std::uint64_t> hung;  // the communicators that could hang
    std::chrono::steady_clock::time_point at;
    std::chrono::steady_clock::duration took{};  // judging
    std::optional<CollectiveDiagnosis> diagnosis;
  };

  void run();
  void exchange(const elastic::RoundInfo& round, const std::vector<RankView>& local,
                std::chrono::steady_clock::time_point local_at);
  // Everything of the exchange thread's that belongs to a round, from the start.
  void begin_round(const elastic::RoundInfo& round);
  // Drops the connection (after a failure): made again next time.
  void drop_client();
  // A follower's (and a gatherer's that replaced another): reads the verdict when it moved;
  // takes over when it has been quiet for long enough, follows a lower group rank's.
  void follow(store::Client& client, const elastic::RoundInfo& round);
  // The gatherer's tick: progress in, views as needed, the verdict out.
  void gather(store::Client& client, const elastic::RoundInfo& round,
              const std::vector<RankView>& local, std::chrono::steady_clock::time_point local_at);
  // Every other node's progress, in one request (after the first of a round).
  void read_progress(store::Client& client, const elastic::RoundInfo& round);
  // The views of the nodes given, in a few requests, with their step history or without;
  // says whether any changed in more than its step history.
  bool read_views(store::Client& client, const elastic::RoundInfo& round,
                  const std::vector<int>& nodes, bool with_steps);
  // Node g's views as read (value): held, unless held already.
  bool take_views(int g, const std::string& value, bool with_steps);
  // The nodes whose views to read this tick, in turn: while a hang is possible those whose
  // views changed, up to kRanksPerHangTick ranks' (the verdict waits for the rest); else those
  // that wrote, up to kRanksPerTick ranks'.
  std::vector<int> views_to_read(const elastic::RoundInfo& round, bool hang_possible);
  // Whether some node's views changed since read (but for their steps).
  bool views_behind(const elastic::RoundInfo& round) const;
  // Frees the step history held (a hang: nothing steps).
  void drop_steps();
  // The verdict over every rank held: judged again only when what it rests on changed.
  std::optional<CollectiveDiagnosis> verdict_over_views(
      const std::vector<RankView>& local, std::chrono::steady_clock::time_point local_at,
      std::vector<std::uint64_t> hung);
  void write_verdict(store::Client& client, const elastic::RoundInfo& round,
                     const std::optional<CollectiveDiagnosis>& d);
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
  int failed_round_ = -1;  // the round whose failure was said
  // After a failed exchange: when the thread tries again, the pause it drew that from (it
  // doubles, from kGatherEvery to kRetryLast), and since when exchanges fail.
  std::chrono::steady_clock::time_point retry_at_{};
  std::chrono::milliseconds retry_pause_{0};
  std::optional<std::chrono::steady_clock::time_point> failing_since_;
  bool failing_ = false;    // the last exchange failed: judge() judges this node's views
  bool gathering_ = false;  // this node is the gatherer of remote_round_
  bool hung_ = false;       // and the job may hang: remote() leaves the step history out
  // The verdict of remote_round_: the gatherer's own, or the one read; nullopt inside: no hang.
  std::optional<std::optional<CollectiveDiagnosis>> verdict_;
  std::thread thread_;  // started by publish; empty until then

  // The exchange thread's own (no lock), but for client_, which the destructor interrupts.
  std::mutex client_mutex_;  // guards client_ (the pointer) against the destructor
  std::unique_ptr<store::Client> client_;
  std::string client_endpoint_;  // host:port of client_
  ViewsWriter writer_;
  int round_no_ = -1;               // the round of what follows
  bool acting_ = false;             // this node gathers
  std::vector<Node> nodes_;         // by group rank (the gatherer's)
  std::size_t next_views_ = 0;      // the group rank to read views from next, in turn
  std::optional<Judged> judged_;    // the gatherer's
  bool views_changed_ = false;      // views read changed since judged_
  int writer_rank_ = 0;             // the group rank that wrote the verdict last read
  std::int64_t verdict_count_ = 0;  // the verdict's count as last read
  std::chrono::steady_clock::time_point
      verdict_moved_at_;  // a verdict last moved (or the round began)
};

}  // namespace ddp::launcher
