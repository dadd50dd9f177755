#pragma once
// The work of watch_round and finish_round while a round runs, on the engine's threads.
// Both wait on the round's end key (round_<r>/end) in slices: the first reason written there
// is what every node acts on.

#include <optional>
#include <string>

#include "ddp/elastic/rendezvous.hpp"
#include "ddp/store/store.hpp"
#include "store_session.hpp"

namespace ddp::elastic {

// Waits until round `round` ends and returns why; empty when it finished (exit barrier
// passed). Each slice it also reads the other members' heartbeats: a node silent for the
// heartbeat budget is removed from the state and the round ended with kNodeLost naming it.
// A store unreachable for that budget ends the watch with a kNodeLost whose node_id is
// empty and whose message names the store. Throws Cancelled.
std::optional<StopReason> watch_until_end(const StoreSession& session, store::Store& store,
                                          const RoundInfo& round, const std::string& self_id);

// The exit barrier: sets this node's round_<r>/done/<node_id>; whoever sees every member's
// key there ends the round as finished. True once it is finished (the state is then marked
// finished, closing the rendezvous); false when the round ended otherwise or
// timeouts.exit_barrier passed. A failing store is retried for the backend's failure budget
// (every step may be repeated: setting the key twice counts once), then StoreError. Throws
// Cancelled.
bool pass_exit_barrier(const StoreSession& session, store::Store& store, const RoundInfo& round);

}  // namespace ddp::elastic
