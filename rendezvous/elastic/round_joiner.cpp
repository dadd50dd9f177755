#include "round_joiner.hpp"

#include <algorithm>
#include <utility>

#include "ddp/elastic/state_backend.hpp"

namespace ddp::elastic {
namespace {

std::chrono::milliseconds ms_until(Clock::time_point then, Clock::time_point now) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(then - now);
}

// How often the tender of an open round reads the queue's counter: from the first value while
// joiners come, doubling to the last while none do.
constexpr std::chrono::milliseconds kTenderPollFirst{10};
constexpr std::chrono::milliseconds kTenderPollLast{200};

std::string nnodes_text(const RoundRules& rules) {
  if (rules.min_nodes == rules.max_nodes) return "--nnodes=" + std::to_string(rules.max_nodes);
  return "--nnodes=" + std::to_string(rules.min_nodes) + ":" + std::to_string(rules.max_nodes);
}

}  // namespace

RoundJoiner::RoundJoiner(const StoreSession& session, store::Store& store, Participant self,
                         std::optional<int> last_round, std::function<void(WaitStatus)> on_wait)
    : session_(session),
      store_(store),
      self_(std::move(self)),
      last_round_(last_round),
      on_wait_(std::move(on_wait)),
      liveness_(session.backend->observer()) {}

RoundInfo RoundJoiner::run() {
  start_ = Clock::now();
  deadline_ = start_ + session_.settings.timeouts.join;
  next_notice_ = start_ + session_.settings.wait_notice_interval;
  bool prepared = false;
  while (true) {
    session_.check_cancel();
    try {
      if (!prepared) {
        // We count as alive before we appear in the state, so others can watch us.
        session_.backend->announce(store_, self_.node_id);
        if (last_round_) {
          auto asked = make_stop(StopReason::Kind::kNodeLeft, self_.node_id, self_.host,
                                 "it asked for a new round");
          last_end_ = session_.end_round(store_, *last_round_, RoundEnd{false, asked});
        }
        prepared = true;
        // The round this node ran ended: one of its members opens the next (the first to
        // claim it); the others queue into it at once, so that N members do not each read a
        // state of N nodes and race to write the next one.
        if (last_round_ && last_end_ && !last_end_->finished) {
          const int next = *last_round_ + 1;
          auto opener = store_.compare_set(session_.keys.opener(next), "", self_.node_id);
          if (opener != self_.node_id) {
            RoundState opening;
            opening.round = next;
            opening.tender = opener;
            await_tender(opening);
            continue;
          }
        }
      }
      auto seen = pending_ ? *std::exchange(pending_, std::nullopt) : read();
      if (seen.state && seen.state->phase == Phase::kOpen && !seen.state->tender.empty() &&
          seen.state->tender != self_.node_id &&
          join_round(seen.state, {self_, last_round_, last_end_}, session_.rules).kind ==
              JoinResult::Kind::kJoined) {
        await_tender(*seen.state);
        failing_since_.reset();
        continue;
      }
      auto view = join(seen);
      failing_since_.reset();
      if (!view) continue;  // lost a compare-and-set: read again
      const RoundState& state = *view->state;
      if (auto info = round_info(state, self_.node_id);
          info && info->round > last_round_.value_or(-1)) {
        store_.set(session_.keys.closed(info->round), "1");  // wakes whoever still waits
        return *info;
      }
      if (state.phase == Phase::kOpen && state.tender == self_.node_id &&
          tend(state, view->token)) {
        continue;
      }
      if (Clock::now() >= deadline_) time_out(state);
      notice(state);
      wait_slice(state);
    } catch (const store::StoreError& e) {
      session_.check_cancel();  // our own client closed under the call
      store_failed(e.what());
    }
  }
}

RoundJoiner::View RoundJoiner::read() {
  StoreStateBackend backend(store_, session_.keys.state());
  auto read = backend.get_state();
  if (!read) return {};
  return {decode_state(read->bytes), read->token};
}

std::optional<RoundJoiner::View> RoundJoiner::join(const View& view) {
  auto result = join_round(view.state, {self_, last_round_, last_end_}, session_.rules);
  const std::string where = "rendezvous '" + session_.settings.run_id + "' at " + session_.endpoint;
  switch (result.kind) {
    case JoinResult::Kind::kFinished:
      throw RendezvousClosedError(where +
                                  " is closed: the job finished; start a new job with another "
                                  "--rdzv_id");
    case JoinResult::Kind::kRejected:
      throw RendezvousError(where + " refused this node: " + result.error);
    default:
      break;
  }
  View out = view;
  if (result.next) {
    session_.check_cancel();
    StoreStateBackend backend(store_, session_.keys.state());
    auto written = backend.set_state(encode_state(*result.next), view.token);
    if (!written.won) {  // the reply is the state that won: start again from it
      pending_ = View{decode_state(written.bytes), written.token};
      return std::nullopt;
    }
    out = View{result.next, written.token};
  }
  int round = out.state->round;
  if (result.request_stop && stop_requested_for_ != round) {
    stop_requested_for_ = round;
    // A round some member already finished is ending well: do not restart it, wait (and be
    // told the job finished).
    std::vector<std::string> members;
    for (const auto& member : out.state->participants) members.push_back(member.node_id);
    if (session_.backend->any_arrived(store_, round, members)) return out;
    auto joined = make_stop(StopReason::Kind::kNodeJoined, self_.node_id, self_.host);
    session_.end_round(store_, round, RoundEnd{false, joined});
  }
  return out;
}

bool RoundJoiner::tend(const RoundState& state, const std::optional<std::string>& token) {
  StoreStateBackend backend(store_, session_.keys.state());
  const int r = state.round;
  auto now = Clock::now();
  // The queue: its counter first (a few bytes), the lines only when it moved.
  if (queue_seen_.first != r) queue_seen_ = {r, 0};
  if (auto count = store_.add(session_.keys.queued(r), 0); count > queue_seen_.second) {
    queue_seen_.second = count;
    std::string text = store_.get(session_.keys.queue(r));
    std::vector<Participant> joiners;
    int skipped = 0;
    int line = 0;
    for (std::size_t at = 0; at < text.size();) {
      auto end = text.find('\n', at);
      if (end == std::string::npos) break;  // never: one APPEND is one whole line
      if (line++ >= state.queued) {
        try {
          joiners.push_back(decode_participant(std::string_view(text).substr(at, end - at)));
        } catch (const RendezvousError&) {
          ++skipped;  // not ours to fail on: leave it out
        }
      }
      at = end + 1;
    }
    if (!joiners.empty() || skipped > 0) {
      auto folded = fold_queued(state, joiners, session_.rules);
      folded.state.queued += skipped;
      session_.check_cancel();
      if (backend.set_state(encode_state(folded.state), token).won) {
        for (const auto& [id, why] : folded.rejected)
          store_.set(session_.keys.rejected(r, id), why);
        if (folded.state.phase != Phase::kOpen) store_.set(session_.keys.closed(r), "1");
        tender_poll_ = std::chrono::milliseconds(0);
      }
      return true;
    }
  }
  if (now >= next_liveness_) {
    next_liveness_ = now + session_.slice();
    auto ids = nodes_to_watch(state);
    ids.erase(std::remove(ids.begin(), ids.end(), self_.node_id), ids.end());
    auto dead = liveness_->dead(store_, ids);
    if (!dead.empty()) {
      RoundState next = state;
      for (const auto& id : dead) next = remove_node(next, id).value_or(next);
      next.tender = self_.node_id;
      session_.check_cancel();
      backend.set_state(encode_state(next), token);  // won or lost: read again either way
      return true;
    }
  }
  if (close_due(state, session_.rules, last_call_.observe(state, session_.rules, now))) {
    session_.check_cancel();
    if (backend.set_state(encode_state(close_round(state, session_.rules)), token).won) {
      store_.set(session_.keys.closed(state.round), "1");
    }
    return true;
  }
  return false;
}

void RoundJoiner::await_tender(const RoundState& state) {
  const int r = state.round;
  if (queued_for_ != r && !is_participant(state, self_.node_id)) {
    session_.check_cancel();
    // The line first, then the count that tells the tender to read the lines (each once,
    // also when a store error comes between them).
    store_.append(session_.keys.queue(r), encode_participant(self_) + "\n");
    queued_for_ = r;
  }
  if (queued_for_ == r && counted_for_ != r) {
    store_.add(session_.keys.queued(r), 1);
    counted_for_ = r;
  }
  while (true) {
    session_.check_cancel();
    auto now = Clock::now();
    if (now >= deadline_) time_out(state);
    if (now >= next_notice_) {  // say how the round fills, from a fresh read of it
      auto fresh = read();
      if (!fresh.state || fresh.state->round != r || fresh.state->phase != Phase::kOpen) {
        pending_ = std::move(fresh);  // it closed meanwhile: go on from what was read
        return;
      }
      notice(*fresh.state);
    }
    try {
      store_.wait({session_.keys.closed(r)},
                  std::max(std::min(session_.slice(), ms_until(deadline_, now)),
                           std::chrono::milliseconds(1)));
      return;  // closed: read who is in
    } catch (const store::StoreTimeout&) {
    }
    const std::string rejected = session_.keys.rejected(r, self_.node_id);
    if (session_.rules.is_static && store_.check({rejected})) {  // only static rejects
      throw RendezvousError("rendezvous '" + session_.settings.run_id + "' at " +
                            session_.endpoint + " refused this node: " + store_.get(rejected));
    }
    if (!liveness_->dead(store_, {state.tender}).empty()) {
      // Remove the dead tender; the next to join the round in the state tends it.
      session_.modify(store_, [&](const std::optional<RoundState>& current) {
        if (!current || current->round != r || current->phase != Phase::kOpen ||
            current->tender != state.tender) {
          return std::optional<RoundState>();
        }
        return remove_node(*current, state.tender);
      });
      return;
    }
  }
}

void RoundJoiner::wait_slice(const RoundState& state) {
  auto now = Clock::now();
  auto wait = std::min(session_.slice(), ms_until(deadline_, now));
  int target = state.round + 1;  // a round runs without us: the next one is ours
  if (state.phase == Phase::kOpen) {
    target = state.round;
    if (auto at_min = last_call_.observe(state, session_.rules, now)) {
      wait = std::min(wait, session_.rules.last_call - *at_min);
    }
    if (state.tender == self_.node_id) {
      // The tender looks at the queue often while joiners come, less often when none do.
      tender_poll_ = std::clamp(tender_poll_ * 2, kTenderPollFirst, kTenderPollLast);
      wait = std::min(wait, tender_poll_);
    }
  }
  wait = std::max(wait, std::chrono::milliseconds(1));
  try {
    store_.wait({session_.keys.closed(target)}, wait);
  } catch (const store::StoreTimeout&) {
    // The slice ended: look at the state again.
  }
}

void RoundJoiner::notice(const RoundState& state) {
  auto now = Clock::now();
  if (now < next_notice_ || !on_wait_) return;
  next_notice_ = now + session_.settings.wait_notice_interval;
  WaitStatus status;
  status.wait_listed = state.phase != Phase::kOpen;
  status.joined = status.wait_listed ? 0 : static_cast<int>(state.participants.size());
  status.min_nodes = session_.rules.min_nodes;
  status.max_nodes = session_.rules.max_nodes;
  status.endpoint = session_.endpoint;
  status.waited = ms_until(now, start_);
  if (!status.wait_listed && status.joined >= status.min_nodes &&
      status.joined < status.max_nodes) {
    if (auto at_min = last_call_.observe(state, session_.rules, now)) {
      status.last_call_left =
          std::max(session_.rules.last_call - *at_min, std::chrono::milliseconds(0));
    }
  }
  on_wait_(status);
}

void RoundJoiner::time_out(const RoundState& state) {
  try {  // best effort: do not count in a round we no longer wait for
    session_.modify(store_, [&](const std::optional<RoundState>& current) {
      return current ? remove_node(*current, self_.node_id) : std::nullopt;
    });
  } catch (const store::StoreError&) {
  }
  const auto& rules = session_.rules;
  std::string text = "rendezvous '" + session_.settings.run_id + "' at " + session_.endpoint +
                     " timed out after " + seconds_text(session_.settings.timeouts.join) + ": ";
  if (state.phase == Phase::kOpen) {
    text += std::to_string(state.participants.size()) + " of the " +
            std::to_string(rules.min_nodes) + " nodes needed joined (" + nnodes_text(rules) +
            "); start the missing agents with the same " +
            (rules.is_static ? "--master_addr, --master_port" : "--rdzv_endpoint, --rdzv_id") +
            " and --nnodes, or raise --rdzv_conf join_timeout";
  } else {
    text += "no place for this node: a round of " + std::to_string(state.participants.size()) +
            " nodes runs and " + nnodes_text(rules) + " allows no more";
  }
  throw RendezvousError(text);
}

void RoundJoiner::store_failed(const std::string& what) {
  if (auto gone = session_.backend->lost_for_good(what)) throw RendezvousError(*gone);
  auto now = Clock::now();
  if (!failing_since_) failing_since_ = now;
  if (now - *failing_since_ < session_.backend->failure_budget()) return;
  throw RendezvousError(session_.backend->lost_text(what));
}

}  // namespace ddp::elastic
