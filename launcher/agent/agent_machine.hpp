#pragma once
// The agent as an explicit state machine: it joins a round through a Rendezvous, starts the
// round's workers, watches them and the round, stops them, and then joins the next round,
// passes the exit barrier, or gives up, with one event dispatch (handle). It owns no thread,
// socket or process: its collaborators sit behind interfaces (Rendezvous, WorkerGroup,
// AgentTimers), so tests drive it in-process with fakes. Internal to the launcher.
//
//   Rendezvous --RoundReady--> Starting --> Running --all exited 0--> Barrier --true--> Draining
//       ^                                    |  a worker failed / RoundStopped           |
//       |                                    v                                           v
//       +--- restart / membership change -- Stopping --restarts exhausted--> Draining -> Done
//   A worker that cannot be started (Starting) is a local failure: Stopping, as above.
//   With workers_run_on (--restart_policy=none), a failed worker, or another node's, stops
//   nothing: Running lasts until every local worker has exited, then Stopping as above.
//   Starting may last (forked workers wait for the warm template): worker exits and a stop
//   of the round that come meanwhile are handled once it ended, in order; a signal at once.
//   A handled signal: ShuttingDown (workers stopped, rendezvous left) --> Draining.
//
// Threading: every method runs on the agent's loop. Callbacks of the Rendezvous (any thread)
// are turned into events and handed to `post`, which must queue them for handle() on the loop.

#include <chrono>
#include <csignal>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "agent/agent_event.hpp"
#include "agent/agent_timers.hpp"
#include "agent/worker_group.hpp"
#include "ddp/elastic/rendezvous.hpp"
#include "ddp/launcher/failure_report.hpp"

namespace ddp::launcher {

class WorkerStartError;

// Once the job has ended, how long teed output may take to reach end-of-file (a worker's
// descendant that left its process group can hold a pipe open) before ddprun exits anyway.
inline constexpr std::chrono::milliseconds kOutputDrainTimeout{5000};
// Once the workers have exited, how long to wait for the rendezvous to say why the round
// stopped: after a local failure the agent then goes on with its own reason; after a failed
// exit barrier it gives up.
inline constexpr std::chrono::milliseconds kStopReasonGrace{5000};
// How long the NCCL workers of a hung job may take to abort their communicators (asked
// through their collective records) and exit by themselves before they get SIGTERM.
inline constexpr std::chrono::milliseconds kAbortGrace{3000};
// The "waiting for N of M nodes" line is printed at most this often.
inline constexpr std::chrono::milliseconds kWaitNoticeInterval{5000};

struct AgentMachineConfig {
  std::string job_name;  // names the job in the failure report (the entrypoint)
  std::string node_id;   // this agent in StopReasons (NodeInfo::node_id)
  int max_restarts = 0;  // --max_restarts: rounds after a worker failure
  std::chrono::milliseconds shutdown_timeout{30000};  // SIGTERM (or the signal) to SIGKILL
  std::chrono::milliseconds drain_timeout = kOutputDrainTimeout;
  // --restart_policy=none: a worker's exit stops no other worker, here or on other nodes; the
  // round ends once every local worker has exited, a failure then as after --restart_policy=all.
  bool workers_run_on = false;
  // --restart_policy=inplace: a failed worker is replaced in the running round while the
  // others go on (each replacement counts against max_restarts), when the program re-forms its
  // process group through ddprun.inplace; else, and when a recovery fails, as
  // --restart_policy=all. recovery_timeout bounds a recovery, from the failure to the moment
  // every rank has joined the new generation.
  bool replace_in_place = false;
  std::chrono::milliseconds recovery_timeout{60000};
};

// How the job ended.
struct AgentOutcome {
  AgentOutcome() = default;
  AgentOutcome(int exit, std::string text, bool keep)
      : exit_code(exit), report(std::move(text)), keep_logs(keep) {}

  // The job's status: 0, the root cause's exit status (exit code, or 128+signal), 1 for a
  // failure of ddprun's own, or 128+signal after a signal to ddprun. The process exits with
  // this under --exit_code=root_cause, and with torchrun's 0 or 1 by default (exit_status()).
  int exit_code = 1;
  int signal = 0;               // the handled signal that ended ddprun; 0: none
  std::string report;           // the failure report, printed after all output; empty on success
  bool keep_logs = false;       // the report points at error files: keep them
  std::string root_error_file;  // the root cause's error file, when it is on this node
  std::vector<WorkerFailure> failures;  // this node's failed workers (root cause first if ours)
};

struct AgentMachineContext {
  elastic::Rendezvous* rendezvous = nullptr;
  WorkerGroup* workers = nullptr;
  AgentTimers* timers = nullptr;
  std::function<void(AgentEvent)> post;            // thread-safe; queues for handle()
  std::function<void(const std::string&)> notice;  // one line for the console (no newline)
  std::function<int()> open_worker_store;          // before each round: a fresh worker store's port
                                                   // (c10d); unset: 0 (the master is fixed)
  std::function<void(AgentOutcome)> on_done;       // once, when the job is over and output drained
  // A step of the job's life for the timeline (--trace_file): "rendezvous", "round ready",
  // "workers started", "worker failed", "restart", "hang", "done", with a detail. Unset: none.
  std::function<void(const std::string& what, const std::string& detail)> milestone;
  // Where the round's collectives are, for a failure's report (one line; empty: no worker
  // records them). Unset: none.
  std::function<std::string()> collectives;
  // --restart_policy=inplace, off the loop (watch/inplace_generations.hpp): begins the
  // generation after the round's current one for a failed rank, answering the generation
  // begun (0: none, and why); waits until every rank joined a generation, answering why not
  // (empty: it formed). Unset: no in-place recovery (as --restart_policy=all).
  std::function<void(const elastic::RoundInfo& round, int rank,
                     std::function<void(int generation, std::string why)> done)>
      begin_generation = nullptr;
  std::function<void(const elastic::RoundInfo& round, int generation,
                     std::chrono::milliseconds limit, std::function<void(std::string why)> done)>
      watch_generation = nullptr;
};

class AgentMachine {
 public:
  enum class State {
    kRendezvous,    // waiting for a round to close
    kStarting,      // starting the round's workers
    kRunning,       // the workers run; a failure or a stop of the round ends it
    kStopping,      // stopping the workers; then restart, re-form, or give up
    kBarrier,       // every local worker succeeded; waiting for the other nodes
    kShuttingDown,  // the agent got a signal: workers stopped, the rendezvous left
    kDraining,      // the outcome is known; waiting for the last output
    kDone,
  };

  AgentMachine(AgentMachineConfig config, AgentMachineContext context);

  // Joins the first round.
  void start();
  // The one event dispatch. Events of an earlier round, or that the state does not expect,
  // are dropped. A worker that cannot be started (WorkerStartError) is a local failure of
  // the round: its workers are stopped, and the group restarts while restarts remain.
  void handle(const AgentEvent& event);

  State state() const { return state_; }
  int round() const { return round_; }  // the current round's sequence number

 private:
  void on(const event::RoundReady& e);
  void on(const event::RoundError& e);
  void on(const event::Waiting& e);
  void on(const event::WorkersStarted& e);
  void on(const event::WorkerExited& e);
  void on(const event::RoundStopped& e);
  void on(const event::BarrierDone& e);
  void on(const event::KillTimer& e);
  void on(const event::GraceTimer& e);
  void on(const event::AbortTimer& e);
  void on(const event::Signal& e);
  void on(const event::Hung& e);
  void on(const event::GenerationBegun& e);
  void on(const event::ReplacementStarted& e);
  void on(const event::GenerationFormed& e);
  void on(const event::OutputDrained& e);
  void on(const event::DrainTimer& e);

  bool current(int round) const { return round == round_; }
  void join_next_round();
  void mark(const std::string& what, const std::string& detail) const;
  void on_local_failure(int local_rank);
  void note_failure_running_on(int local_rank);
  void end_round_run_on();
  void send_root_cause(WorkerFailure root, std::vector<WorkerFailure> others);
  void note_late_failure(int local_rank);
  // --restart_policy=inplace: replace local_rank's failed worker, or fall back.
  void replace_in_place(int local_rank);
  // The recovery under way cannot go on: one line says why, and every worker stops as after
  // --restart_policy=all, the replaced worker's failure the root cause (with `also`, a
  // failure of its replacement).
  void fall_back(const std::string& why, std::optional<WorkerFailure> also = std::nullopt);
  // A recovery waits for its generation: the failed worker's slot counts as running (its exit
  // is counted already; the replacement's will be, once it starts).
  bool slot_pending() const;
  // Restarts and in-place replacements made so far: what --max_restarts bounds.
  int restarts_used() const;
  void on_start_failure(const WorkerStartError& error);
  void local_failure(WorkerFailure root, std::vector<WorkerFailure> others);
  void stop_workers(int signal);
  // The stop after a hang: NCCL workers first get kAbortGrace to abort and exit by themselves.
  void stop_hung_workers();
  void on_group_exited();
  void decide_after_stop();
  void start_grace_timer();
  void give_up(const elastic::StopReason& reason);
  void signal_again(int number);
  void finish(AgentOutcome outcome);
  void done();

  AgentMachineConfig config_;
  AgentMachineContext ctx_;
  State state_ = State::kRendezvous;
  int round_ = 0;                           // incremented by every next_round call
  std::optional<elastic::RoundInfo> info_;  // the round that runs (or ran last)
  int group_size_ = 0;
  bool starting_ = false;             // WorkersStarted not come yet
  std::vector<AgentEvent> deferred_;  // what came while starting_, handled after it
  int exits_seen_ = 0;
  bool group_exited_ = false;
  std::optional<elastic::StopReason> reason_;       // why the round ends, as all nodes agreed
  std::optional<elastic::StopReason> sent_reason_;  // ours, given to stop_round
  std::optional<WorkerFailure> root_cause_;         // a local failure that ended the round
  std::vector<WorkerFailure> other_failures_;       // local workers that had failed too
  std::vector<WorkerFailure> ran_on_failures_;      // workers_run_on: failed while the others ran
  // replace_in_place: the recovery under way, and the replacements made in the job.
  struct Recovery {
    WorkerFailure failure;  // the worker replaced
    int generation = 0;     // the generation begun for it; 0 until then
    AgentTimers::Clock::time_point began;
    // Why it cannot succeed, seen before its generation began: a survivor here exited 0.
    std::string doomed;
  };
  std::optional<Recovery> recovery_;
  int replacing_ = 0;  // the generation whose replacement is being started (0: none)
  int replaced_ = 0;
  int signal_ = 0;              // the handled signal that shuts the agent down
  std::vector<int> forwarded_;  // the signals the workers got from this shutdown, once each
  int stop_signal_ = SIGTERM;   // the signal the workers were last asked to stop with
  std::optional<AgentTimers::Clock::time_point> last_wait_notice_;
  AgentOutcome outcome_;
};

// One line for humans on why a round stopped ("rank 3 on node-b failed: exit code 1").
std::string stop_reason_text(const elastic::StopReason& reason);
// The root cause as the failure report shows it, from what the rendezvous carried.
WorkerFailure failure_from(const elastic::StopReason& reason);

}  // namespace ddp::launcher
