#include "round_watcher.hpp"

#include <algorithm>
#include <thread>

namespace ddp::elastic {
namespace {

using Ms = std::chrono::milliseconds;

// Waits one slice for the round's end; returns it once set.
std::optional<RoundEnd> wait_end(const StoreSession& session, store::Store& store, int round,
                                 std::chrono::milliseconds slice) {
  const std::string key = session.keys.end(round);
  try {
    store.wait({key}, std::max(slice, std::chrono::milliseconds(1)));
  } catch (const store::StoreTimeout&) {
    return std::nullopt;
  }
  return decode_end(store.get(key));
}

// Removes the dead nodes from the state and ends the round with kNodeLost naming the first.
void report_lost(const StoreSession& session, store::Store& store, const RoundInfo& round,
                 const std::vector<std::string>& dead) {
  session.modify(store, [&](const std::optional<RoundState>& current) -> std::optional<RoundState> {
    if (!current) return std::nullopt;
    RoundState next = *current;
    bool changed = false;
    for (const auto& id : dead) {
      if (auto removed = remove_node(next, id)) {
        next = std::move(*removed);
        changed = true;
      }
    }
    if (!changed) return std::nullopt;
    return next;
  });
  auto lost = make_stop(StopReason::Kind::kNodeLost, dead.front());
  for (const auto& member : round.members) {
    if (member.node_id == dead.front()) lost.host = member.host;
  }
  lost.message = session.backend->dead_text();
  session.end_round(store, round.round, RoundEnd{false, lost});
}

}  // namespace

std::optional<StopReason> watch_until_end(const StoreSession& session, store::Store& store,
                                          const RoundInfo& round, const std::string& self_id) {
  // Group rank 0 watches every other member; rank 1 watches rank 0; the others watch ranks 0
  // and 1 and speak only when both are gone. One node reads N heartbeats a slice, the rest
  // one or two: linear in the nodes, and one node reports a lost one.
  std::vector<std::string> others;
  bool all_must_die = false;
  if (round.group_rank == 0) {
    for (const auto& member : round.members) {
      if (member.node_id != self_id) others.push_back(member.node_id);
    }
  } else {
    for (std::size_t g = 0; g < std::min<std::size_t>(2, round.members.size()); ++g) {
      if (round.members[g].node_id != self_id) others.push_back(round.members[g].node_id);
    }
    all_must_die = others.size() > 1;
  }
  auto liveness = session.backend->observer();
  const auto budget = session.backend->failure_budget();
  std::optional<Clock::time_point> failing_since;
  while (true) {
    session.check_cancel();
    try {
      if (auto end = wait_end(session, store, round.round, session.slice())) {
        if (end->finished) return std::nullopt;
        return end->reason;
      }
      if (failing_since) session.notice("ddprun: " + session.endpoint + " answers again");
      failing_since.reset();
      auto dead = liveness->dead(store, others);
      if (!dead.empty() && (!all_must_die || dead.size() == others.size())) {
        report_lost(session, store, round, dead);
      }
    } catch (const store::StoreError& e) {
      session.check_cancel();  // our own client closed under the call: not the store's fault
      auto now = Clock::now();
      if (auto gone = session.backend->lost_for_good(e.what())) {  // no point in waiting
        auto lost = make_stop(StopReason::Kind::kNodeLost, "", session.settings.store_host);
        lost.message = *gone;
        return lost;
      }
      if (!failing_since) {
        failing_since = now;
        session.notice("ddprun: " + session.endpoint + " does not answer (" + e.what() +
                       "); the workers keep running while ddprun retries for " +
                       seconds_text(budget) + ", then stops them");
      }
      if (now - *failing_since >= budget) {
        auto lost = make_stop(StopReason::Kind::kNodeLost, "", session.settings.store_host);
        lost.message = session.backend->lost_text(e.what());
        return lost;
      }
    }
  }
}

bool pass_exit_barrier(const StoreSession& session, store::Store& store, const RoundInfo& round) {
  std::vector<std::string> members;
  for (const auto& member : round.members) members.push_back(member.node_id);
  const std::string& self = session.settings.self.node_id;
  const auto budget = session.backend->failure_budget();
  auto deadline = Clock::now() + session.settings.timeouts.exit_barrier;
  bool arrived = false;
  bool last = false;  // this node's arrival was the members' count: it looks at the keys
  std::optional<Clock::time_point> failing_since;
  while (true) {
    session.check_cancel();
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    try {
      if (!arrived) {
        store.set(session.keys.done(round.round, self), "1");
        arrived = true;
        // A hint only (a retried ADD counts twice): the keys decide.
        last = store.add(session.keys.arrived(round.round), 1) >=
               static_cast<std::int64_t>(members.size());
      }
      // Group rank 0 looks every slice, not only on arrival: the last member may die right
      // after it set its key, and a finish written by another node may have been lost with
      // the store. The others wait for the end: N keys are read by one or two nodes.
      if ((last || round.group_rank == 0) &&
          session.backend->all_arrived(store, round.round, members)) {
        session.end_round(store, round.round, RoundEnd{true, {}});
      }
      auto end = wait_end(session, store, round.round, std::min(session.slice(), left));
      if (failing_since) session.notice("ddprun: " + session.endpoint + " answers again");
      failing_since.reset();
      if (end) {
        if (!end->finished) return false;
        // The nodes that looked at the keys close the rendezvous (idempotent).
        if (last || round.group_rank == 0) {
          session.modify(store, [&](const std::optional<RoundState>& current) {
            return current ? finish(*current, round.round) : std::nullopt;
          });
        }
        return true;
      }
    } catch (const store::StoreError& e) {
      session.check_cancel();
      auto now = Clock::now();
      if (session.backend->lost_for_good(e.what())) throw;
      if (!failing_since) {
        failing_since = now;
        session.notice("ddprun: " + session.endpoint + " does not answer in the exit barrier (" +
                       e.what() + "); retrying for " + seconds_text(budget));
      }
      if (now - *failing_since >= budget) throw;
      // A store that fails at once is not asked again in a tight loop.
      std::this_thread::sleep_for(std::min(session.slice(), std::max(left, Ms(0))));
    }
    if (Clock::now() >= deadline) return false;
  }
}

}  // namespace ddp::elastic
