#pragma once
// The rendezvous as pure logic: a RoundState value (kept as JSON under one store key per run)
// and functions from (state, input) to (new state, action). No store, no thread, no clock of
// its own: the driver (store_rendezvous.cpp) reads the state, calls these, and writes the
// result back with compare-and-set; whoever loses the race re-reads and calls them again.
//
// A run is a sequence of rounds 0, 1, 2, ... Each round is first kOpen (nodes join), then
// kRunning (closed: members and ranks fixed, workers run), and the last one may become
// kFinished (every member passed the exit barrier; late nodes are refused).
//
// Rank order (c10d): the nodes the round expected (the previous round's members in their old
// group-rank order, then the nodes that waited) come first, in that order; the others follow
// in join order. So group rank 0, and with it MASTER_ADDR, stays on the same node across
// restarts while it lives. Static: group rank = the node's --node_rank.

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ddp/elastic/rendezvous.hpp"

namespace ddp::elastic {

// One node as the round state records it.
struct Participant {
  std::string node_id;
  std::string host;
  std::string addr;
  int local_world_size = 1;
  std::string role = "default";
  std::optional<int> fixed_group_rank;  // static: --node_rank
  int worker_store_port = 0;            // c10d: the workers' store if it becomes group rank 0
};

enum class Phase {
  kOpen,      // nodes join; closes at MAX, at MIN after last call, or when all expected joined
  kRunning,   // closed: participants are the members by group rank
  kFinished,  // every member passed the exit barrier: the job is done
};

struct RoundState {
  int round = 0;
  Phase phase = Phase::kOpen;
  int restart_count = 0;                  // TORCHELASTIC_RESTART_COUNT of this round
  std::vector<Participant> participants;  // kOpen: join order; kRunning: by group rank
  std::vector<Participant> wait_list;     // kRunning: nodes waiting for the next round
  std::vector<std::string> expected;      // kOpen, round > 0: ids whose joining closes the round
  std::string master_addr;                // kRunning: MASTER_ADDR of the round's workers
  int master_port = 0;                    // kRunning: MASTER_PORT
  // kOpen: the node that adds queued joiners and closes the round (the one that opened it;
  // empty once it was removed: the next node to see that takes over).
  std::string tender;
  int queued = 0;  // kOpen: joiners taken from the round's queue so far (round_joiner.hpp)
};

// What the pure functions need to know of the settings.
struct RoundRules {
  bool is_static = false;  // ranks from fixed_group_rank; the master is the rendezvous store
  int min_nodes = 1;
  int max_nodes = 1;
  std::chrono::milliseconds last_call{std::chrono::seconds(30)};
  std::string static_master_addr;  // static: the rendezvous store's host
  int static_master_port = 0;      // static: the rendezvous store's port
};
RoundRules rules_of(const RendezvousSettings& settings);

// How a running round ended, as its end key records it (the first writer wins).
struct RoundEnd {
  bool finished = false;  // true: every member passed the exit barrier
  StopReason reason;      // when !finished
};

// A StopReason of the given kind, naming a node (the fields of a worker failure left unset).
StopReason make_stop(StopReason::Kind kind, std::string node_id = {}, std::string host = {},
                     std::string message = {});

// What a node brings to next_round.
struct JoinInput {
  Participant self;
  std::optional<int> last_round;           // the round this node last ran, if any
  std::optional<RoundEnd> last_round_end;  // how that round ended (read from its end key)
};

struct JoinResult {
  enum class Kind {
    kJoined,      // in the open round (again); wait for it to close
    kInRound,     // already a member of the running round (closed while this node waited)
    kWaitListed,  // a round runs without this node: wait for the next one
    kFinished,    // the job finished: RendezvousClosedError
    kRejected,    // static: node_rank out of range or taken; `error` says which
  };
  Kind kind = Kind::kJoined;
  std::optional<RoundState> next;  // the state to compare-and-set; empty: nothing changes
  bool request_stop = false;       // kWaitListed: the running round has room, end it (kNodeJoined)
  std::string error;               // kRejected
};

// One step of next_round. With no state yet, round 0 opens with this node. A member of the
// round it last ran (which has ended) opens the next round: restart count carried over (+1
// only when it ended with kWorkerFailed), the wait list moved in, and the survivors plus the
// wait list expected. The result may already be closed (MAX reached, or all expected in).
JoinResult join_round(const std::optional<RoundState>& state, const JoinInput& input,
                      const RoundRules& rules);

// The joiners the tender took from an open round's queue (RoundJoiner, round_joiner.hpp; its
// keys in run_keys.hpp), in queue order: each joins as join_round would have it join (a full
// round wait-lists it), and a static node whose --node_rank is out of range or taken is left
// out, with why. `queued` counts them all.
struct Folded {
  RoundState state;
  std::vector<std::pair<std::string, std::string>> rejected;  // node id, why
};
Folded fold_queued(const RoundState& open, const std::vector<Participant>& joiners,
                   const RoundRules& rules);

// True when the open round must close now: MAX nodes; or MIN nodes and either every expected
// node joined (round > 0) or the observer has seen MIN for last_call (at_min_for).
bool close_due(const RoundState& state, const RoundRules& rules,
               std::optional<std::chrono::milliseconds> at_min_for);

// Closes the open round: orders the members (see the file comment), sets the master.
RoundState close_round(RoundState state, const RoundRules& rules);

// Removes a node (dead, left) from participants, wait list and expected. Empty when it was
// in none of them.
std::optional<RoundState> remove_node(const RoundState& state, std::string_view node_id);

// The exit barrier passed: marks round `round` finished. Empty when the state is not that
// round running (already finished, or moved on).
std::optional<RoundState> finish(const RoundState& state, int round);

// TORCHELASTIC_RESTART_COUNT of the round after one that ended with `end`.
int next_restart_count(int previous, const RoundEnd& end);

// This node's view of a running round; empty when it is not a member.
std::optional<RoundInfo> round_info(const RoundState& state, std::string_view node_id);

bool is_participant(const RoundState& state, std::string_view node_id);
bool is_waiting(const RoundState& state, std::string_view node_id);

// The open round's ids that should be alive: participants and expected nodes not yet joined.
std::vector<std::string> nodes_to_watch(const RoundState& state);

// How long one observer has seen an open round at MIN or more, on its own steady clock (the
// last call is never compared across nodes' clocks). Starts again when the round changes or
// falls below MIN.
class LastCallTimer {
 public:
  using Clock = std::chrono::steady_clock;
  std::optional<std::chrono::milliseconds> observe(const RoundState& state, const RoundRules& rules,
                                                   Clock::time_point now);

 private:
  int round_ = -1;
  std::optional<Clock::time_point> since_;
};

// JSON forms (the store's value). Parsing throws RendezvousError naming what is wrong.
std::string encode_state(const RoundState& state);
RoundState decode_state(std::string_view json);
std::string encode_end(const RoundEnd& end);
RoundEnd decode_end(std::string_view json);
// One line of a round's join queue (no newline in it).
std::string encode_participant(const Participant& node);
Participant decode_participant(std::string_view json);

// The round a write to a rendezvous store closes, read with the run's key layout: the state
// ("/ddprun/<run id>/state") once it holds a round that is no longer open, or
// "/ddprun/<run id>/round_<r>/closed"; 0 for any other write. The state comes first: a joiner
// that reads it closed starts its workers before the closing node sets the key.
int round_closed_by(std::string_view key, std::string_view value);

}  // namespace ddp::elastic
