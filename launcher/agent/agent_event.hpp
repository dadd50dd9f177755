#pragma once
// The events that drive the agent's state machine (AgentMachine::handle). Everything the
// agent waits for arrives as one of these, on its loop: results of the rendezvous (posted from
// the engine's threads), worker exits, signals, timers, the end of teed output.
//
// `round` is the agent's own sequence number of the round an event belongs to (one per
// next_round call); the machine drops an event of any round but the current one.

#include <exception>
#include <optional>
#include <string>
#include <variant>

#include "agent/worker_start_error.hpp"
#include "ddp/elastic/rendezvous.hpp"
#include "ddp/launcher/failure_report.hpp"
#include "process/worker.hpp"

namespace ddp::launcher::event {

struct RoundReady {  // the rendezvous closed a round with this node in it
  int round = 0;
  elastic::RoundInfo info;
};
struct RoundError {  // the round could not be formed (timeout, closed, store lost)
  int round = 0;
  std::exception_ptr error;
};
struct Waiting {  // progress while the rendezvous waits for nodes
  int round = 0;
  elastic::WaitStatus status;
};
struct WorkersStarted {  // the round's start ended (WorkerGroup::start's on_started)
  int round = 0;
  int started = 0;                        // workers that started
  std::optional<WorkerStartError> error;  // the worker that could not be started
};
struct WorkerExited {  // a worker of the round exited and was reaped
  int round = 0;
  int local_rank = 0;
  WorkerExit exit;
};
struct RoundStopped {  // the running round must end, for the reason every node agreed on
  int round = 0;
  elastic::StopReason reason;
};
struct BarrierDone {  // the exit barrier's outcome (finish_round)
  int round = 0;
  bool all_succeeded = false;
};
struct KillTimer {  // --shutdown_timeout passed since the workers were asked to stop
  int round = 0;
};
struct GraceTimer {  // the barrier failed and no stop reason came
  int round = 0;
};
struct AbortTimer {  // a hung job's NCCL workers were asked to abort a while ago
  int round = 0;
};
struct Signal {  // one of --signals_to_handle reached the agent
  int number = 0;
};
struct Hung {  // the hang monitor found the round's collectives stuck (--hang_timeout)
  int round = 0;
  WorkerFailure root_cause;  // the rank to blame, hung = true, the report in error
};
// --restart_policy=inplace (AgentMachineContext::begin_generation and watch_generation).
struct GenerationBegun {  // the next generation began for local_rank's failed worker, or not
  int round = 0;
  int local_rank = 0;
  int generation = 0;  // 0: it did not begin
  std::string why;     // why not
};
struct ReplacementStarted {  // WorkerGroup::replace's on_started
  int round = 0;
  int generation = 0;
  int started = 0;
  std::optional<WorkerStartError> error;
};
struct GenerationFormed {  // every rank joined the generation, or the wait for it ended
  int round = 0;
  int generation = 0;
  std::string why;  // why it did not form; empty: it formed
};
struct OutputDrained {};  // teed output of every worker reached end-of-file
struct DrainTimer {};     // waited long enough for the last output

}  // namespace ddp::launcher::event

namespace ddp::launcher {

using AgentEvent =
    std::variant<event::RoundReady, event::RoundError, event::Waiting, event::WorkersStarted,
                 event::WorkerExited, event::RoundStopped, event::BarrierDone, event::KillTimer,
                 event::GraceTimer, event::AbortTimer, event::Signal, event::Hung,
                 event::GenerationBegun, event::ReplacementStarted, event::GenerationFormed,
                 event::OutputDrained, event::DrainTimer>;

}  // namespace ddp::launcher
