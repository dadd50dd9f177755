#pragma once
// torchelastic's events as torchrun 2.x records them for --event_log_handler=console: one JSON
// line per event ({"name": "torchelastic.worker.status.<STATE>", "source": "AGENT"|"WORKER",
// "timestamp": 0, "metadata": {...}}), field for field, so that tools reading torchrun's
// events read ddprun's.

#include <sys/types.h>

#include <optional>
#include <string>

namespace ddp::launcher {

// What every event of one agent says about the job.
struct EventJob {
  std::string run_id;
  std::string role;
  std::string hostname;
  std::string rdzv_backend;
  std::string entry_point;  // the program's name, as torchrun's get_entrypoint_name()
  int max_restarts = 0;
};

// The agent's view when it records: its group (unknown before the first round) and restarts.
struct EventAgent {
  std::optional<int> group_rank;
  std::optional<int> group_world_size;
  int restarts = 0;  // agent_restarts: restarts used so far
};

// The agent's own event (RENDEZVOUS, ASSIGN_WORKER_RANKS, SUCCEEDED, FAILED).
std::string agent_event(const EventJob& job, const EventAgent& agent, const std::string& state,
                        std::optional<double> duration_ms = std::nullopt,
                        std::optional<std::string> raw_error = std::nullopt);

// One worker's (START, SUCCEEDED, FAILED, TERMINATED). worker_id is its pid; exit_code,
// failure_pid and raw_error are set for a failure only, as torchrun does.
struct EventWorker {
  int rank = 0;             // RANK
  int local_rank = 0;       // LOCAL_RANK
  int role_rank = 0;        // ROLE_RANK
  int role_world_size = 0;  // ROLE_WORLD_SIZE
  pid_t pid = 0;
  std::optional<int> exit_code;
  std::optional<pid_t> failure_pid;
  std::optional<std::string> raw_error;
};
std::string worker_event(const EventJob& job, const EventAgent& agent, const std::string& state,
                         const EventWorker& worker);

}  // namespace ddp::launcher
