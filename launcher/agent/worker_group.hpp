#pragma once
// The agent's workers of one round, behind a narrow interface so that the agent's state
// machine is tested in-process with a fake (as ninja tests its build loop with a fake command
// runner). The real one (ProcessWorkerGroup) spawns processes; internal to the launcher.

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "agent/worker_start_error.hpp"
#include "ddp/elastic/rendezvous.hpp"
#include "ddp/launcher/failure_report.hpp"
#include "diagnosis/rank_view.hpp"
#include "process/worker.hpp"

namespace ddp::launcher {

class WorkerGroup {
 public:
  // Called on the agent's loop once per worker, when it has exited and been reaped.
  using ExitHandler = std::function<void(int local_rank, WorkerExit exit)>;
  // How a round's start ended.
  struct StartResult {
    int started = 0;  // workers that started (local ranks 0 .. started-1); each reports its exit
    std::optional<WorkerStartError> error;  // the worker that could not be started
  };
  using StartedHandler = std::function<void(StartResult)>;

  virtual ~WorkerGroup() = default;

  // Starts one worker per local rank for this round (replacing the group of an earlier
  // round, which must have exited), with ranks from round. on_exit is called once per
  // worker that started. on_started is called once when the start ended: before start
  // returns, or later on the loop (forked workers wait for the warm template; the loop goes
  // on meanwhile). A worker that cannot be started ends it with an error: the workers
  // started before it run on and report their exits.
  virtual void start(const elastic::RoundInfo& round, ExitHandler on_exit,
                     StartedHandler on_started) = 0;

  // Sends signal to the process group of every worker still running. While the round
  // starts, no more workers start: on_started follows with those that did, and a worker
  // whose fork was under way gets the signal too.
  virtual void signal(int signal) = 0;

  // The whole group has exited: kills whatever is left in the workers' process groups and
  // stops guarding them.
  virtual void release() = 0;

  // --restart_policy=inplace: starts local_rank's worker again, in the round that runs, after
  // its worker exited: forked by the warm template when it can (else exec'd), with
  // DDPRUN_INPLACE_GENERATION=generation. on_started is called once (maybe before replace
  // returns): started 1, or the error; the new worker's exit is reported as any worker's. A
  // signal sent to the group meanwhile reaches it once it started. By default: none started.
  virtual void replace(int local_rank, int generation, StartedHandler on_started) {
    (void)local_rank;
    (void)generation;
    on_started(StartResult{});
  }

  // --restart_policy=inplace: SIGKILLs local_rank's worker (its process group), which the hang
  // diagnosis blames; its exit is then reported as any worker's. False when it does not run
  // (by default: nothing is killed).
  virtual bool kill_worker(int local_rank) {
    (void)local_rank;
    return false;
  }

  // What is known of a worker that exited (rank, pid, exit, its error file), for reports.
  virtual WorkerFailure failure_of(int local_rank) = 0;

  // Workers other than except that have already failed, reaped now without waiting (their
  // exit events may still be queued): the "other failures" of a report.
  virtual std::vector<WorkerFailure> other_failures(int except) = 0;

  // Workers still running (for the notice before a SIGKILL).
  virtual std::vector<StillRunning> still_running() const = 0;

  // True while teed output of any round has not reached end-of-file.
  virtual bool output_pending() const = 0;

  // Before the group is stopped for a failure or a hang: Python workers still running whose
  // ddprun probe asked for it are sent its stack signal and write every thread's Python stack
  // into their stack file (never their stderr); the stop's signal waits for their dumps (a
  // bounded wait), then reaches them as any worker, so that their SIGTERM handlers run. The
  // group reports the stacks grouped (ProcessWorkerGroupOptions::notice) and writes one file
  // per rank.
  virtual void dump_python_stacks() {}

  // After a failure stop, once the whole group has exited: lists the PyTorch Flight Recorder
  // dumps this round's workers left (TORCH_NCCL_DUMP_ON_TIMEOUT) and runs PyTorch's analyser
  // over them off the loop; its verdict is output (output_pending() until it is printed).
  virtual void analyse_flight_recorder() {}
  // The job hung: asks each running libddp worker to abort its NCCL communicators (the
  // collective record's stop request), so that it fails with that reason and exits by itself.
  // True when some local worker records an NCCL communicator (it is worth waiting for).
  virtual bool request_abort() { return false; }

  // How long output may still take because an analysis runs (0: none runs); the job's end
  // waits for output that long at least.
  virtual std::chrono::milliseconds analysis_time_left() const { return {}; }

  // Each worker of the round as its collective record shows it (empty: none recorded).
  virtual std::vector<RankView> rank_views() const { return {}; }
};

}  // namespace ddp::launcher
