#include "agent/agent_machine.hpp"

#include <algorithm>
#include <csignal>
#include <cstdio>

#include "agent/worker_start_error.hpp"
#include "ddp/launcher/signal_names.hpp"

namespace ddp::launcher {

using elastic::StopReason;

namespace {

// The end after a handled signal to ddprun: 128+N, as a shell reports a process killed by it.
AgentOutcome signalled(int number) {
  AgentOutcome outcome(128 + number, "", false);
  outcome.signal = number;
  return outcome;
}

}  // namespace

AgentMachine::AgentMachine(AgentMachineConfig config, AgentMachineContext context)
    : config_(std::move(config)), ctx_(std::move(context)) {}

void AgentMachine::start() { join_next_round(); }

void AgentMachine::handle(const AgentEvent& event) {
  std::visit([this](const auto& e) { on(e); }, event);
}

// Rendezvous: ask for the next round; every callback is tagged with its sequence number so
// that a late one of an earlier round is recognised and dropped.
void AgentMachine::mark(const std::string& what, const std::string& detail) const {
  if (ctx_.milestone) ctx_.milestone(what, detail);
}

void AgentMachine::join_next_round() {
  state_ = State::kRendezvous;
  const int round = ++round_;
  mark("rendezvous", "");
  last_wait_notice_.reset();
  int worker_store_port = 0;
  try {
    worker_store_port = ctx_.open_worker_store ? ctx_.open_worker_store() : 0;
  } catch (const std::exception& e) {  // out of descriptors, say: no round can form here
    return finish({1,
                   "ddprun: cannot open the workers' store of the next round: " +
                       std::string(e.what()) + "\n",
                   false});
  }
  auto post = ctx_.post;
  ctx_.rendezvous->next_round(
      worker_store_port,
      [post, round](elastic::RoundInfo info) {
        post(event::RoundReady{round, std::move(info)});
      },
      [post, round](std::exception_ptr error) {
        post(event::RoundError{round, error});
      },
      [post, round](elastic::WaitStatus status) {
        post(event::Waiting{round, status});
      });
}

// Starting: watch the round, then start its workers.
void AgentMachine::on(const event::RoundReady& e) {
  if (!current(e.round) || state_ != State::kRendezvous) return;
  state_ = State::kStarting;
  info_ = e.info;
  group_size_ = info_->members.at(static_cast<std::size_t>(info_->group_rank)).local_world_size;
  mark("round ready", "round " + std::to_string(info_->round) + ", restart count " +
                          std::to_string(info_->restart_count) + ", " +
                          std::to_string(info_->members.size()) + " node(s)");
  exits_seen_ = 0;
  group_exited_ = false;
  reason_.reset();
  sent_reason_.reset();
  root_cause_.reset();
  other_failures_.clear();
  ran_on_failures_.clear();
  recovery_.reset();
  replacing_ = 0;
  auto post = ctx_.post;
  const int round = round_;
  ctx_.rendezvous->watch_round([post, round](StopReason reason) {
    post(event::RoundStopped{round, std::move(reason)});
  });
  starting_ = true;
  deferred_.clear();
  ctx_.workers->start(
      *info_,
      [post, round](int local_rank, WorkerExit exit) {
        post(event::WorkerExited{round, local_rank, exit});
      },
      [post, round](WorkerGroup::StartResult result) {
        post(event::WorkersStarted{round, result.started, std::move(result.error)});
      });
}

// The start ended: the workers run, or one could not be started. What came meanwhile is
// handled now, in order. After a signal (ShuttingDown), the group is the workers that started.
void AgentMachine::on(const event::WorkersStarted& e) {
  if (!current(e.round) || !starting_) return;
  starting_ = false;
  if (state_ == State::kStarting && e.error) {
    on_start_failure(*e.error);
  } else if (state_ == State::kStarting) {
    mark("workers started", "");
    state_ = State::kRunning;
  } else {
    group_size_ = e.error ? e.error->started() : e.started;
  }
  for (const AgentEvent& deferred : std::exchange(deferred_, {})) handle(deferred);
  if (state_ == State::kShuttingDown && !group_exited_ && exits_seen_ == group_size_) {
    on_group_exited();
  }
}

// A worker could not be started: a local failure like a worker's, with the cause as its
// message. The workers started before it are stopped; then restart or give up as usual.
void AgentMachine::on_start_failure(const WorkerStartError& error) {
  state_ = State::kRunning;
  group_size_ = error.started();
  ctx_.notice("ddprun: " + std::string(error.what()));
  local_failure(error.failure(), {});
  if (exits_seen_ == group_size_) on_group_exited();  // none had started
}

void AgentMachine::on(const event::RoundError& e) {
  if (!current(e.round) || state_ != State::kRendezvous) return;
  std::string what = "unknown error";
  try {
    std::rethrow_exception(e.error);
  } catch (const std::exception& error) {
    what = error.what();
  } catch (...) {
  }
  finish({1, "ddprun: rendezvous at " + ctx_.rendezvous->endpoint() + " failed: " + what + "\n",
          false});
}

// One line at most every kWaitNoticeInterval while the round waits for nodes.
void AgentMachine::on(const event::Waiting& e) {
  if (!current(e.round) || state_ != State::kRendezvous) return;
  const auto now = ctx_.timers->now();
  if (last_wait_notice_ && now - *last_wait_notice_ < kWaitNoticeInterval) return;
  last_wait_notice_ = now;
  const elastic::WaitStatus& s = e.status;
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(s.waited).count();
  const std::string where = " at " + s.endpoint + " (" + std::to_string(seconds) + " s)";
  if (s.wait_listed) {
    ctx_.notice("ddprun: a round runs without this node; waiting to join the next one" + where);
  } else if (s.joined < s.min_nodes) {
    ctx_.notice("ddprun: waiting for " + std::to_string(s.min_nodes - s.joined) + " of " +
                std::to_string(s.min_nodes) + " nodes" + where);
  } else if (s.last_call_left) {
    const auto left = std::chrono::ceil<std::chrono::seconds>(*s.last_call_left).count();
    ctx_.notice("ddprun: " + std::to_string(s.joined) + " of at most " +
                std::to_string(s.max_nodes) + " nodes joined" + where +
                "; last call: the round starts with these in " + std::to_string(left) +
                " s (last_call_timeout) unless " + std::to_string(s.max_nodes) + " join sooner");
  } else {
    ctx_.notice("ddprun: " + std::to_string(s.joined) + " of at most " +
                std::to_string(s.max_nodes) + " nodes joined; waiting for the round to close" +
                where);
  }
}

// Running / Stopping / ShuttingDown: a worker exited.
void AgentMachine::on(const event::WorkerExited& e) {
  if (!current(e.round) || group_exited_) return;
  if (starting_) return deferred_.push_back(e);
  if (state_ != State::kRunning && state_ != State::kStopping && state_ != State::kShuttingDown) {
    return;
  }
  ++exits_seen_;
  if (state_ == State::kRunning && e.exit.failed()) {
    if (config_.workers_run_on) {
      note_failure_running_on(e.local_rank);
    } else if (config_.replace_in_place) {
      replace_in_place(e.local_rank);
    } else {
      on_local_failure(e.local_rank);
    }
  }
  if (state_ == State::kRunning && !e.exit.failed() && recovery_) {
    // It never joins the next generation: waiting for it would only wait for the time limit.
    // Before the generation began, the answer to beginning it says why first (it may be that
    // the program never used the API).
    const int rank = ctx_.workers->failure_of(e.local_rank).rank;
    const std::string why = "rank " + std::to_string(rank) + " exited (exit code 0) while rank " +
                            std::to_string(recovery_->failure.rank) +
                            " was being replaced, so it cannot join the next generation";
    if (slot_pending()) {
      if (recovery_->doomed.empty()) recovery_->doomed = why;
    } else {
      fall_back(why);
      return;
    }
  }
  if (state_ == State::kStopping && e.exit.failed()) note_late_failure(e.local_rank);
  if (exits_seen_ == group_size_ && !slot_pending() && !group_exited_) on_group_exited();
}

// A worker that exits with a failure while the group is being stopped is listed with the other
// failures, as torchrun 2.x lists the workers it stopped: killed by the stop's SIGTERM
// ("exitcode: -15 ... (SIGTERM)"), failed from its own SIGTERM handler, or failed on its own
// before the stop reached it (its error file written). One that exits 0 is not a failure.
void AgentMachine::note_late_failure(int local_rank) {
  if (root_cause_ && root_cause_->local_rank == local_rank) return;
  for (const WorkerFailure& other : other_failures_) {
    if (other.local_rank == local_rank) return;  // reaped with the root cause already
  }
  other_failures_.push_back(ctx_.workers->failure_of(local_rank));
}

// The root cause. Workers that have already failed too are "other failures", and so are the
// ones the stop ends with a failure (note_late_failure). Every node learns it through the round.
void AgentMachine::on_local_failure(int local_rank) {
  WorkerFailure root = ctx_.workers->failure_of(local_rank);
  if (ctx_.collectives) root.collectives = ctx_.collectives();
  local_failure(std::move(root), ctx_.workers->other_failures(local_rank));
}

// In-place recovery: the failed worker's slot is taken by a replacement once the next
// generation began in the workers' store; the recovery ends when every rank has joined it.
void AgentMachine::replace_in_place(int local_rank) {
  WorkerFailure failure = ctx_.workers->failure_of(local_rank);
  if (recovery_) {
    const std::string what = "rank " + std::to_string(failure.rank) + " failed too (" +
                             failure.describe_exit() + ") while rank " +
                             std::to_string(recovery_->failure.rank) + " was being replaced";
    return fall_back(what, std::move(failure));
  }
  if (restarts_used() >= config_.max_restarts || !ctx_.begin_generation) {
    return on_local_failure(local_rank);  // no restart left: the report, as under all
  }
  mark("worker failed", "rank " + std::to_string(failure.rank) + ": " + failure.describe_exit());
  ctx_.notice("ddprun: rank " + std::to_string(failure.rank) + " failed (" +
              failure.describe_exit() +
              "); --restart_policy=inplace: replacing it while the other workers go on");
  recovery_ = Recovery{std::move(failure), 0, ctx_.timers->now(), ""};
  auto post = ctx_.post;
  const int round = round_;
  ctx_.begin_generation(
      *info_, recovery_->failure.rank, [post, round, local_rank](int generation, std::string why) {
        post(event::GenerationBegun{round, local_rank, generation, std::move(why)});
      });
}

void AgentMachine::on(const event::GenerationBegun& e) {
  if (!current(e.round) || state_ != State::kRunning || !recovery_ || recovery_->generation != 0 ||
      recovery_->failure.local_rank != e.local_rank) {
    return;
  }
  if (e.generation == 0) return fall_back(e.why);
  if (!recovery_->doomed.empty())
    return fall_back(std::string(recovery_->doomed));  // a copy: fall_back moves the recovery away
  recovery_->generation = e.generation;
  --exits_seen_;  // the slot runs again; the replacement's exit is counted as any worker's
  replacing_ = e.generation;
  auto post = ctx_.post;
  const int round = round_;
  const int generation = e.generation;
  ctx_.workers->replace(
      e.local_rank, generation, [post, round, generation](WorkerGroup::StartResult result) {
        post(event::ReplacementStarted{round, generation, result.started, std::move(result.error)});
      });
  ctx_.watch_generation(*info_, generation, config_.recovery_timeout,
                        [post, round, generation](std::string why) {
                          post(event::GenerationFormed{round, generation, std::move(why)});
                        });
}

// Whatever the state, a replacement that did not start gives its slot back as exited.
void AgentMachine::on(const event::ReplacementStarted& e) {
  if (!current(e.round) || replacing_ != e.generation) return;
  replacing_ = 0;
  if (e.started > 0) return;
  ++exits_seen_;
  if (state_ == State::kRunning && recovery_ && recovery_->generation == e.generation) {
    return fall_back(e.error
                         ? "its replacement could not be started: " + std::string(e.error->what())
                         : std::string("its replacement could not be started"));
  }
  if (exits_seen_ == group_size_ && !group_exited_) on_group_exited();
}

void AgentMachine::on(const event::GenerationFormed& e) {
  if (!current(e.round) || state_ != State::kRunning || !recovery_ ||
      recovery_->generation != e.generation) {
    return;
  }
  if (!e.why.empty()) return fall_back(e.why);
  ++replaced_;
  const double seconds =
      std::chrono::duration<double>(ctx_.timers->now() - recovery_->began).count();
  char took[32];
  std::snprintf(took, sizeof took, "%.2f", seconds);
  const std::string rank = std::to_string(recovery_->failure.rank);
  mark("replaced", "rank " + rank + ", generation " + std::to_string(e.generation));
  ctx_.notice("ddprun: rank " + rank + " was replaced in place: generation " +
              std::to_string(e.generation) + " formed " + took + " s after its failure (" +
              std::to_string(restarts_used()) + " of at most " +
              std::to_string(config_.max_restarts) + " restarts used)");
  recovery_.reset();
}

void AgentMachine::fall_back(const std::string& why, std::optional<WorkerFailure> also) {
  Recovery recovery = std::move(*recovery_);
  recovery_.reset();
  ctx_.notice("ddprun: the in-place recovery of rank " + std::to_string(recovery.failure.rank) +
              " falls back to restarting every worker: " + why);
  std::vector<WorkerFailure> others = ctx_.workers->other_failures(recovery.failure.local_rank);
  if (also && also->local_rank == recovery.failure.local_rank) others.push_back(*also);
  local_failure(std::move(recovery.failure), std::move(others));
  if (exits_seen_ == group_size_ && !group_exited_) on_group_exited();
}

bool AgentMachine::slot_pending() const { return recovery_ && recovery_->generation == 0; }

int AgentMachine::restarts_used() const { return (info_ ? info_->restart_count : 0) + replaced_; }

// --restart_policy=none: the failure is kept, and said at once while other local workers run
// on (after the last one the report follows at once).
void AgentMachine::note_failure_running_on(int local_rank) {
  WorkerFailure failure = ctx_.workers->failure_of(local_rank);
  mark("worker failed", "rank " + std::to_string(failure.rank) + ": " + failure.describe_exit());
  if (const int running = group_size_ - exits_seen_; running > 0) {
    ctx_.notice("ddprun: rank " + std::to_string(failure.rank) + " failed (" +
                failure.describe_exit() + "); --restart_policy=none: the " +
                std::to_string(running) +
                " other worker(s) here go on, and the job ends when every worker has exited");
  }
  ran_on_failures_.push_back(std::move(failure));
}

// --restart_policy=none, once every local worker has exited: the round ends for a failure,
// ours (the first local one is the root cause, the others follow) or another node's.
void AgentMachine::end_round_run_on() {
  if (!ran_on_failures_.empty()) {
    WorkerFailure root = ran_on_failures_.front();
    std::vector<WorkerFailure> others(ran_on_failures_.begin() + 1, ran_on_failures_.end());
    send_root_cause(std::move(root), std::move(others));
  }
  state_ = State::kStopping;
}

// The job hung: the report so far goes out at once (the stop takes up to --shutdown_timeout),
// then the round ends as after a worker failure, with the blamed rank as its root cause.
// Under --restart_policy=inplace, only the blamed rank is killed, by its own node's agent, and
// its exit is a failure like any: replaced in place (or the fallback). Another node's agent
// leaves it to that node.
void AgentMachine::on(const event::Hung& e) {
  if (!current(e.round) || state_ != State::kRunning) return;
  if (e.root_cause.error) ctx_.notice("ddprun: " + e.root_cause.error->traceback);
  const bool replaceable = config_.replace_in_place && !recovery_ &&
                           restarts_used() < config_.max_restarts && ctx_.begin_generation;
  if (replaceable && !e.root_cause.blamed) {
    ctx_.notice(
        "ddprun: --restart_policy=inplace: the hang diagnosis blames no rank, so no rank can be "
        "replaced: every worker is stopped, as under --restart_policy=all");
  } else if (replaceable) {
    const WorkerFailure& root = e.root_cause;
    const std::string rank = "rank " + std::to_string(root.rank);
    const bool ours = root.local_rank >= 0 && root.local_rank < group_size_ &&
                      ctx_.workers->failure_of(root.local_rank).pid == root.pid;
    if (!ours) {
      return ctx_.notice("ddprun: the hang diagnosis blames " + rank + " on " + root.host +
                         "; --restart_policy=inplace: its node kills and replaces it");
    }
    if (ctx_.workers->kill_worker(root.local_rank)) {
      return ctx_.notice("ddprun: --restart_policy=inplace: killing " + rank + " (pid " +
                         std::to_string(root.pid) +
                         "), which the hang diagnosis blames, to replace it; the other workers "
                         "go on");
    }
  }
  local_failure(e.root_cause, ctx_.workers->other_failures(-1));
}

// The root cause is ours: tell the other nodes, stop the local workers.
void AgentMachine::local_failure(WorkerFailure root, std::vector<WorkerFailure> others) {
  send_root_cause(std::move(root), std::move(others));
  ctx_.workers->dump_python_stacks();
  if (root_cause_->hung) return stop_hung_workers();
  stop_workers(SIGTERM);
}

// Keeps the root cause and its companions, and ends the round for every node with it.
void AgentMachine::send_root_cause(WorkerFailure root, std::vector<WorkerFailure> others) {
  recovery_.reset();
  root_cause_ = std::move(root);
  other_failures_ = std::move(others);
  mark(root_cause_->hung ? "hang" : "worker failed",
       "rank " + std::to_string(root_cause_->rank) + ": " + root_cause_->describe_exit());
  state_ = State::kStopping;
  StopReason reason;
  static_cast<elastic::WorkerRecord&>(reason) = *root_cause_;
  reason.kind = root_cause_->hung ? StopReason::Kind::kHung : StopReason::Kind::kWorkerFailed;
  reason.node_id = config_.node_id;
  if (root_cause_->error) reason.message = root_cause_->error->message;
  sent_reason_ = reason;
  ctx_.rendezvous->stop_round(reason);
}

void AgentMachine::stop_hung_workers() {
  if (!ctx_.workers->request_abort()) return stop_workers(SIGTERM);
  auto post = ctx_.post;
  const int round = round_;
  ctx_.timers->start(TimerId::kAbort, kAbortGrace,
                     [post, round] { post(event::AbortTimer{round}); });
}

void AgentMachine::on(const event::AbortTimer& e) {
  if (!current(e.round) || group_exited_ || state_ != State::kStopping) return;
  stop_workers(SIGTERM);
}

// Signals every running worker's group, and SIGKILLs what is left after the timeout.
void AgentMachine::stop_workers(int signal) {
  stop_signal_ = signal;
  ctx_.workers->signal(signal);
  auto post = ctx_.post;
  const int round = round_;
  ctx_.timers->start(TimerId::kKill, config_.shutdown_timeout,
                     [post, round] { post(event::KillTimer{round}); });
}

void AgentMachine::on(const event::KillTimer& e) {
  if (!current(e.round) || group_exited_) return;
  if (state_ == State::kStopping || state_ == State::kShuttingDown) {
    if (auto left = ctx_.workers->still_running(); !left.empty()) {
      ctx_.notice(kill_notice(config_.shutdown_timeout, stop_signal_, left));
    }
    ctx_.workers->signal(SIGKILL);
  }
}

// The whole group has exited: pass the barrier, shut down, or decide after a stop.
void AgentMachine::on_group_exited() {
  group_exited_ = true;
  ctx_.timers->cancel(TimerId::kKill);
  ctx_.timers->cancel(TimerId::kAbort);
  ctx_.workers->release();
  if (state_ == State::kShuttingDown) return finish(signalled(signal_));
  if (state_ == State::kRunning && (!ran_on_failures_.empty() || (reason_ && reason_->failed()))) {
    end_round_run_on();
  }
  if (state_ == State::kStopping) {
    const bool failed = sent_reason_ || (reason_ && reason_->failed());
    if (failed) ctx_.workers->analyse_flight_recorder();
    if (!reason_) start_grace_timer();  // ours was sent; the agreed one should follow
    return decide_after_stop();
  }
  state_ = State::kBarrier;
  auto post = ctx_.post;
  const int round = round_;
  ctx_.rendezvous->finish_round([post, round](bool all_succeeded) {
    post(event::BarrierDone{round, all_succeeded});
  });
}

// The round must end, for the reason every node agreed on.
void AgentMachine::on(const event::RoundStopped& e) {
  if (!current(e.round) || reason_) return;
  if (state_ == State::kStarting) return deferred_.push_back(e);
  if (state_ == State::kRunning && config_.workers_run_on && e.reason.failed()) {
    reason_ = e.reason;  // decided on once every local worker has exited
    ctx_.notice("ddprun: " + stop_reason_text(e.reason) +
                "; --restart_policy=none: the workers here go on");
    return;
  }
  if (state_ == State::kRunning) {
    reason_ = e.reason;
    const bool pending = slot_pending();
    if (recovery_) {
      ctx_.notice("ddprun: the in-place recovery of rank " +
                  std::to_string(recovery_->failure.rank) + " ends: the round stops");
      recovery_.reset();
    }
    ctx_.notice("ddprun: stopping the workers: " + stop_reason_text(e.reason));
    state_ = State::kStopping;
    if (e.reason.failed()) ctx_.workers->dump_python_stacks();
    if (pending && exits_seen_ == group_size_) return on_group_exited();
    if (e.reason.kind == StopReason::Kind::kHung) return stop_hung_workers();
    return stop_workers(SIGTERM);
  }
  if (state_ == State::kStopping || state_ == State::kBarrier) {
    reason_ = e.reason;
    if (state_ == State::kStopping) decide_after_stop();
  }
}

void AgentMachine::on(const event::BarrierDone& e) {
  if (!current(e.round) || state_ != State::kBarrier) return;
  if (e.all_succeeded) return finish({0, "", false});
  state_ = State::kStopping;  // every local worker has exited; wait for the reason
  if (reason_) return decide_after_stop();
  start_grace_timer();
}

void AgentMachine::start_grace_timer() {
  auto post = ctx_.post;
  const int round = round_;
  ctx_.timers->start(TimerId::kGrace, kStopReasonGrace,
                     [post, round] { post(event::GraceTimer{round}); });
}

// No stop reason came from the rendezvous in time: after a local failure, go on with ours;
// after a failed exit barrier, give up.
void AgentMachine::on(const event::GraceTimer& e) {
  if (!current(e.round) || state_ != State::kStopping || reason_) return;
  if (sent_reason_) {
    reason_ = sent_reason_;
    return decide_after_stop();
  }
  finish({1,
          "ddprun: the exit barrier at " + ctx_.rendezvous->endpoint() +
              " failed and no node said why; giving up\n",
          false});
}

// Stopping, once both the workers have exited and the reason is known: the next round, or
// the end when a worker failure finds no restart left.
void AgentMachine::decide_after_stop() {
  if (!group_exited_ || !reason_) return;
  ctx_.timers->cancel(TimerId::kGrace);
  const StopReason reason = *reason_;
  if (!reason.failed()) {
    mark("re-form", stop_reason_text(reason));
    ctx_.notice("ddprun: " + stop_reason_text(reason) +
                "; re-forming the group (a membership change, not counted against "
                "--max_restarts)");
    return join_next_round();
  }
  const int restarts = restarts_used();
  if (restarts >= config_.max_restarts) return give_up(reason);
  mark("restart", stop_reason_text(reason));
  ctx_.notice("ddprun: worker group failed (" + stop_reason_text(reason) +
              "); restarting it (restart " + std::to_string(restarts + 1) + " of at most " +
              std::to_string(config_.max_restarts) + ")");
  join_next_round();
}

// No restart left: the report names the root cause, wherever it happened.
void AgentMachine::give_up(const StopReason& reason) {
  const bool ours = root_cause_ && reason.node_id == config_.node_id &&
                    reason.local_rank == root_cause_->local_rank;
  AgentOutcome outcome;
  if (ours) {
    outcome.report = format_failure_report(config_.job_name, *root_cause_, other_failures_);
    outcome.exit_code = root_cause_->status();
    outcome.keep_logs = root_cause_->error.has_value();
    if (root_cause_->error && !root_cause_->hung) outcome.root_error_file = root_cause_->error_file;
    for (const auto& other : other_failures_) outcome.keep_logs |= other.error.has_value();
    outcome.failures.push_back(*root_cause_);
    outcome.failures.insert(outcome.failures.end(), other_failures_.begin(), other_failures_.end());
  } else {
    std::vector<WorkerFailure> local;  // ours failed too, but another node's came first
    if (root_cause_) local.push_back(*root_cause_);
    local.insert(local.end(), other_failures_.begin(), other_failures_.end());
    WorkerFailure root = failure_from(reason);
    outcome.report = format_failure_report(config_.job_name, root, local);
    outcome.exit_code = root.status() != 0 ? root.status() : 1;
    for (const auto& failure : local) outcome.keep_logs |= failure.error.has_value();
    outcome.failures = std::move(local);
  }
  finish(std::move(outcome));
}

// A handled signal: forward it to the workers (SIGKILL after the timeout), leave the
// rendezvous so the others can go on. Once the outcome is known, it ends the wait for the last
// output.
void AgentMachine::on(const event::Signal& e) {
  if (state_ == State::kDraining || state_ == State::kDone) return done();
  if (state_ == State::kShuttingDown) return signal_again(e.number);
  signal_ = e.number;
  const bool workers_run =
      (state_ == State::kStarting || state_ == State::kRunning || state_ == State::kStopping) &&
      !group_exited_;
  if (!workers_run) {
    ctx_.notice("ddprun: got " + signal_name(e.number) + ": leaving the rendezvous");
    ctx_.rendezvous->leave();
    return finish(signalled(e.number));
  }
  ctx_.notice("ddprun: got " + signal_name(e.number) + ": forwarding it to the workers");
  const bool pending = slot_pending();  // no replacement comes now
  recovery_.reset();
  state_ = State::kShuttingDown;
  forwarded_ = {e.number};
  stop_workers(e.number);
  ctx_.rendezvous->leave();
  if (pending && !starting_ && exits_seen_ == group_size_) on_group_exited();
}

// Another signal while the workers stop: it never shortens their grace, since `timeout`,
// container runtimes and Slurm send the same signal twice within milliseconds, and a worker
// in its handler may be writing a checkpoint. SIGKILL comes only when --shutdown_timeout has
// passed. A repeat is not forwarded (a handler entered again would start its work over); a
// signal the workers have not had yet is, with a full --shutdown_timeout from now.
void AgentMachine::signal_again(int number) {
  const std::string name = signal_name(number);
  if (std::find(forwarded_.begin(), forwarded_.end(), number) != forwarded_.end()) {
    return ctx_.notice("ddprun: " + name +
                       " again: the workers have it already; still waiting for them (SIGKILL "
                       "only once --shutdown_timeout has passed)");
  }
  forwarded_.push_back(number);
  ctx_.notice("ddprun: got " + name + ": forwarding it to the workers too; still waiting for them");
  stop_workers(number);
}

// Draining: the outcome is known; wait (bounded) for the last teed output.
void AgentMachine::finish(AgentOutcome outcome) {
  outcome_ = std::move(outcome);
  mark("done", "exit status " + std::to_string(outcome_.exit_code));
  state_ = State::kDraining;
  ctx_.timers->cancel(TimerId::kKill);
  ctx_.timers->cancel(TimerId::kGrace);
  if (!ctx_.workers->output_pending()) return done();
  auto post = ctx_.post;
  const auto wait = std::max(config_.drain_timeout, ctx_.workers->analysis_time_left());
  ctx_.timers->start(TimerId::kDrain, wait, [post] { post(event::DrainTimer{}); });
}

void AgentMachine::on(const event::OutputDrained&) {
  if (state_ == State::kDraining) done();
}

void AgentMachine::on(const event::DrainTimer&) {
  if (state_ == State::kDraining) done();
}

void AgentMachine::done() {
  if (state_ == State::kDone) return;
  state_ = State::kDone;
  ctx_.timers->cancel(TimerId::kDrain);
  ctx_.on_done(std::move(outcome_));
}

namespace {

// "vm (agent pid 4242)": the node's host and, since several agents may share a host, its
// agent's pid, taken from the node id "<host>_<pid>_<random>"; just the host (or the id)
// for an id of another form.
std::string agent_name(const StopReason& reason) {
  if (reason.host.empty()) return reason.node_id;
  const std::string& id = reason.node_id;
  const std::size_t begin = reason.host.size() + 1;
  const std::size_t end = id.rfind('_');
  if (!id.starts_with(reason.host + "_") || end == std::string::npos || end <= begin) {
    return reason.host;
  }
  const std::string pid = id.substr(begin, end - begin);
  if (!std::all_of(pid.begin(), pid.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return reason.host;
  }
  return reason.host + " (agent pid " + pid + ")";
}

}  // namespace

std::string stop_reason_text(const StopReason& reason) {
  const std::string node = reason.host.empty() ? reason.node_id : reason.host;
  const std::string agent = agent_name(reason);
  switch (reason.kind) {
    case StopReason::Kind::kHung:
      return reason.message;  // the hang's report says it all
    case StopReason::Kind::kWorkerFailed:
      return "rank " + std::to_string(reason.rank) + " on " + node + ": " +
             failure_from(reason).describe_exit();
    case StopReason::Kind::kNodeLost:
      if (reason.node_id.empty()) {
        return reason.message.empty() ? "the rendezvous store at " + node + " was lost"
                                      : reason.message;
      }
      return "node " + agent + " stopped answering (" +
             (reason.message.empty() ? std::string("its heartbeat went stale") : reason.message) +
             ")";
    case StopReason::Kind::kNodeJoined:
      return "node " + agent + " waits to join";
    case StopReason::Kind::kNodeLeft:
      return "node " + agent + " left the job";
  }
  return "the round stopped";
}

WorkerFailure failure_from(const StopReason& reason) {
  WorkerFailure failure;
  static_cast<elastic::WorkerRecord&>(failure) = reason;
  failure.time = std::chrono::system_clock::now();
  if (failure.host.empty()) failure.host = reason.node_id;
  if (!reason.message.empty()) failure.error = ErrorFileContent{reason.message, ""};
  return failure;
}

}  // namespace ddp::launcher
