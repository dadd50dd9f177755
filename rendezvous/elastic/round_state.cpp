#include "ddp/elastic/round_state.hpp"

#include <algorithm>
#include <climits>
#include <unordered_map>
#include <unordered_set>

namespace ddp::elastic {
namespace {

const Participant* find(const std::vector<Participant>& nodes, std::string_view node_id) {
  for (const auto& node : nodes) {
    if (node.node_id == node_id) return &node;
  }
  return nullptr;
}

bool erase_node(std::vector<Participant>& nodes, std::string_view node_id) {
  auto it = std::remove_if(nodes.begin(), nodes.end(),
                           [&](const Participant& node) { return node.node_id == node_id; });
  bool found = it != nodes.end();
  nodes.erase(it, nodes.end());
  return found;
}

std::string describe_node(const Participant& node) { return node.host + " (" + node.node_id + ")"; }

// Static: the node's --node_rank must be in range and not held by another joined node.
std::string static_rank_error(const RoundState& state, const Participant& self,
                              const RoundRules& rules) {
  if (!self.fixed_group_rank) return "the static rendezvous needs a --node_rank on every node";
  int rank = *self.fixed_group_rank;
  if (rank < 0 || rank >= rules.max_nodes) {
    return "--node_rank " + std::to_string(rank) + " is outside 0.." +
           std::to_string(rules.max_nodes - 1) + " (--nnodes=" + std::to_string(rules.max_nodes) +
           ")";
  }
  for (const auto& node : state.participants) {
    if (node.fixed_group_rank == self.fixed_group_rank) {
      return "--node_rank " + std::to_string(rank) + " is already taken by node " +
             describe_node(node) + "; give every node its own --node_rank";
    }
  }
  return {};
}

// A round runs without self: wait for the next one, and end this one when it has room.
JoinResult wait_for_next(const RoundState& state, const Participant& self,
                         const RoundRules& rules) {
  JoinResult result{JoinResult::Kind::kWaitListed, {}, false, {}};
  result.request_stop = static_cast<int>(state.participants.size()) < rules.max_nodes;
  if (!is_waiting(state, self.node_id)) {
    RoundState next = state;
    next.wait_list.push_back(self);
    result.next = std::move(next);
  }
  return result;
}

// Adds self to an open round (or to its wait list when it is full), closing the round when
// that completes it.
JoinResult join_open(const RoundState& state, const Participant& self, const RoundRules& rules) {
  if (is_participant(state, self.node_id)) {
    if (!state.tender.empty()) return {JoinResult::Kind::kJoined, {}, false, {}};
    RoundState next = state;  // its tender was removed: this member takes over
    next.tender = self.node_id;
    return {JoinResult::Kind::kJoined, std::move(next), false, {}};
  }
  if (static_cast<int>(state.participants.size()) >= rules.max_nodes) {
    return wait_for_next(state, self, rules);
  }
  if (rules.is_static) {
    if (auto error = static_rank_error(state, self, rules); !error.empty()) {
      return {JoinResult::Kind::kRejected, {}, false, error};
    }
  }
  RoundState next = state;
  erase_node(next.wait_list, self.node_id);
  next.participants.push_back(self);
  if (next.tender.empty()) next.tender = self.node_id;
  if (close_due(next, rules, std::nullopt)) next = close_round(std::move(next), rules);
  return {JoinResult::Kind::kJoined, std::move(next), false, {}};
}

// The running round ended and self was in it: open the next one with the survivors expected
// and as many waiting nodes as fit.
JoinResult open_next(const RoundState& state, const Participant& self, const RoundEnd& end,
                     const RoundRules& rules) {
  RoundState next;
  next.round = state.round + 1;
  next.phase = Phase::kOpen;
  next.tender = self.node_id;
  next.restart_count = next_restart_count(state.restart_count, end);
  for (const auto& node : state.participants) next.expected.push_back(node.node_id);
  int room = rules.max_nodes - static_cast<int>(state.participants.size());
  for (const auto& node : state.wait_list) {
    if (room-- > 0) {
      next.expected.push_back(node.node_id);
      next.participants.push_back(node);
    } else {
      next.wait_list.push_back(node);
    }
  }
  return join_open(next, self, rules);
}

}  // namespace

RoundRules rules_of(const RendezvousSettings& settings) {
  RoundRules rules;
  rules.is_static = settings.backend == "static";
  rules.min_nodes = settings.min_nodes;
  rules.max_nodes = settings.max_nodes;
  rules.last_call = settings.timeouts.last_call;
  rules.static_master_addr = settings.store_host;
  rules.static_master_port = settings.store_port;
  return rules;
}

JoinResult join_round(const std::optional<RoundState>& state, const JoinInput& input,
                      const RoundRules& rules) {
  if (!state) return join_open(RoundState{}, input.self, rules);
  const std::string& id = input.self.node_id;
  switch (state->phase) {
    case Phase::kFinished:
      return {JoinResult::Kind::kFinished, {}, false, {}};
    case Phase::kOpen:
      return join_open(*state, input.self, rules);
    case Phase::kRunning:
      break;
  }
  bool member = is_participant(*state, id);
  bool ran_it = input.last_round && *input.last_round >= state->round;
  if (member && !ran_it) return {JoinResult::Kind::kInRound, {}, false, {}};
  if (member) {
    // The round this node ran has ended: without a recorded end (the driver sets one before
    // asking), it counts as a membership change.
    RoundEnd end =
        input.last_round_end.value_or(RoundEnd{false, make_stop(StopReason::Kind::kNodeLeft)});
    if (end.finished) return {JoinResult::Kind::kFinished, {}, false, {}};
    return open_next(*state, input.self, end, rules);
  }
  return wait_for_next(*state, input.self, rules);
}

Folded fold_queued(const RoundState& open, const std::vector<Participant>& joiners,
                   const RoundRules& rules) {
  Folded out{open, {}};
  for (const auto& joiner : joiners) {
    if (out.state.phase != Phase::kOpen) break;  // closed by the last one: the rest wait
    ++out.state.queued;
    auto result = join_open(out.state, joiner, rules);
    if (result.kind == JoinResult::Kind::kRejected) {
      out.rejected.emplace_back(joiner.node_id, result.error);
    } else if (result.next) {
      int queued = out.state.queued;
      out.state = std::move(*result.next);
      out.state.queued = queued;
    }
  }
  return out;
}

bool close_due(const RoundState& state, const RoundRules& rules,
               std::optional<std::chrono::milliseconds> at_min_for) {
  if (state.phase != Phase::kOpen) return false;
  int joined = static_cast<int>(state.participants.size());
  if (joined >= rules.max_nodes) return true;
  if (joined < rules.min_nodes) return false;
  if (state.round > 0 && joined >= static_cast<int>(state.expected.size())) {
    // A set, not a search per expected node: the tender asks this for every joiner it takes
    // in, and a re-round of 1,000 nodes expects 1,000.
    std::unordered_set<std::string_view> in;
    for (const auto& node : state.participants) in.insert(node.node_id);
    bool all_in = std::all_of(state.expected.begin(), state.expected.end(),
                              [&](const std::string& id) { return in.contains(id); });
    if (all_in) return true;
  }
  return at_min_for && *at_min_for >= rules.last_call;
}

RoundState close_round(RoundState state, const RoundRules& rules) {
  std::unordered_map<std::string_view, int> place;  // expected node -> its place
  for (std::size_t i = 0; i < state.expected.size(); ++i) {
    place.emplace(state.expected[i], static_cast<int>(i));
  }
  auto order = [&](const Participant& node) -> std::pair<int, int> {
    if (rules.is_static) return {node.fixed_group_rank.value_or(INT_MAX), 0};
    auto it = place.find(node.node_id);
    return {it == place.end() ? INT_MAX : it->second, 0};
  };
  // stable_sort keeps join order among the nodes that were not expected.
  std::stable_sort(state.participants.begin(), state.participants.end(),
                   [&](const Participant& a, const Participant& b) { return order(a) < order(b); });
  state.phase = Phase::kRunning;
  state.expected.clear();
  if (rules.is_static) {
    state.master_addr = rules.static_master_addr;
    state.master_port = rules.static_master_port;
  } else if (!state.participants.empty()) {
    state.master_addr = state.participants.front().addr;
    state.master_port = state.participants.front().worker_store_port;
  }
  return state;
}

std::optional<RoundState> remove_node(const RoundState& state, std::string_view node_id) {
  RoundState next = state;
  bool found = erase_node(next.participants, node_id);
  found = erase_node(next.wait_list, node_id) || found;
  auto it = std::find(next.expected.begin(), next.expected.end(), node_id);
  if (it != next.expected.end()) {
    next.expected.erase(it);
    found = true;
  }
  if (!found) return std::nullopt;
  if (next.tender == node_id) next.tender.clear();
  return next;
}

std::optional<RoundState> finish(const RoundState& state, int round) {
  if (state.phase != Phase::kRunning || state.round != round) return std::nullopt;
  RoundState next = state;
  next.phase = Phase::kFinished;
  next.wait_list.clear();
  return next;
}

StopReason make_stop(StopReason::Kind kind, std::string node_id, std::string host,
                     std::string message) {
  StopReason reason;
  reason.kind = kind;
  reason.node_id = std::move(node_id);
  reason.host = std::move(host);
  reason.message = std::move(message);
  return reason;
}

int next_restart_count(int previous, const RoundEnd& end) {
  bool failed = !end.finished && end.reason.failed();
  return failed ? previous + 1 : previous;
}

std::optional<RoundInfo> round_info(const RoundState& state, std::string_view node_id) {
  if (state.phase == Phase::kOpen) return std::nullopt;
  RoundInfo info;
  info.round = state.round;
  info.restart_count = state.restart_count;
  info.master_addr = state.master_addr;
  info.master_port = state.master_port;
  info.group_rank = -1;
  for (const auto& node : state.participants) {
    if (node.node_id == node_id) info.group_rank = static_cast<int>(info.members.size());
    info.members.push_back({node.node_id, node.host, node.addr, node.local_world_size, node.role});
  }
  if (info.group_rank < 0) return std::nullopt;
  return info;
}

bool is_participant(const RoundState& state, std::string_view node_id) {
  return find(state.participants, node_id) != nullptr;
}

bool is_waiting(const RoundState& state, std::string_view node_id) {
  return find(state.wait_list, node_id) != nullptr;
}

std::vector<std::string> nodes_to_watch(const RoundState& state) {
  std::vector<std::string> ids;
  for (const auto& node : state.participants) ids.push_back(node.node_id);
  for (const auto& node : state.wait_list) ids.push_back(node.node_id);
  for (const auto& id : state.expected) {
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  }
  return ids;
}

std::optional<std::chrono::milliseconds> LastCallTimer::observe(const RoundState& state,
                                                                const RoundRules& rules,
                                                                Clock::time_point now) {
  bool at_min =
      state.phase == Phase::kOpen && static_cast<int>(state.participants.size()) >= rules.min_nodes;
  if (!at_min || state.round != round_) {
    round_ = state.round;
    since_.reset();
  }
  if (!at_min) return std::nullopt;
  if (!since_) since_ = now;
  return std::chrono::duration_cast<std::chrono::milliseconds>(now - *since_);
}

}  // namespace ddp::elastic
