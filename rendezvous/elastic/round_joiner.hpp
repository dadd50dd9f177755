#pragma once
// next_round's work, on the engine's round thread: join (or open, or wait for) the next
// round and wait until it closes. The node that opened a round is its tender: it takes the
// joiners from the round's queue into the state (one compare-and-set for many joiners),
// removes nodes the backend calls dead (stale heartbeat, expired lease) and closes the round
// when it is due. Every other joiner appends itself to the queue once and waits for the
// round to close, looking only at the tender's heartbeat: a node's requests per round do not
// grow with the number of nodes, and the state is written by one node at a time. When the
// tender dies, the first joiner to see it removes it and becomes the tender.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <utility>

#include "ddp/elastic/round_state.hpp"
#include "ddp/store/store.hpp"
#include "store_session.hpp"

namespace ddp::elastic {

class RoundJoiner {
 public:
  // last_round: the round this node last ran (its end is read, or set when missing).
  RoundJoiner(const StoreSession& session, store::Store& store, Participant self,
              std::optional<int> last_round, std::function<void(WaitStatus)> on_wait);

  // The round this node is a member of, once it closed. Throws RendezvousClosedError (the
  // job finished), RendezvousError (join timeout, rejected, store lost) or Cancelled.
  RoundInfo run();

 private:
  struct View {
    std::optional<RoundState> state;
    std::optional<std::string> token;
  };
  View read();
  // Joins, opens or waits; returns the resulting state, or empty when a CAS was lost.
  std::optional<View> join(const View& view);
  // Open round, on its tender: takes queued joiners in, removes dead nodes, closes it when
  // due. True when the state changed (or a write was tried).
  bool tend(const RoundState& state, const std::optional<std::string>& token);
  // Open round that another node tends: queues this node (once per round) and waits until
  // the round closes, the tender is gone, or it is time to say how the round fills.
  void await_tender(const RoundState& state);
  void wait_slice(const RoundState& state);
  void notice(const RoundState& state);
  [[noreturn]] void time_out(const RoundState& state);
  // Failures are retried for the backend's failure budget, then reported as a lost store.
  void store_failed(const std::string& what);

  const StoreSession& session_;
  store::Store& store_;
  Participant self_;
  std::optional<int> last_round_;
  std::optional<RoundEnd> last_end_;
  std::function<void(WaitStatus)> on_wait_;
  std::unique_ptr<LivenessObserver> liveness_;
  LastCallTimer last_call_;
  Clock::time_point start_;
  Clock::time_point deadline_;
  Clock::time_point next_notice_;
  std::optional<Clock::time_point> failing_since_;
  std::optional<View> pending_;  // the state a lost compare-and-set returned
  int stop_requested_for_ = -1;
  int queued_for_ = -1;   // the round whose queue has this node's line
  int counted_for_ = -1;  // the round whose queue count this node added to
  // The tender: the round and queue count it last read the lines at.
  std::pair<int, std::int64_t> queue_seen_{-1, 0};
  std::chrono::milliseconds tender_poll_{0};  // the tender: how often it looks at the queue
  Clock::time_point next_liveness_;           // the tender: when it next reads heartbeats
};

}  // namespace ddp::elastic
