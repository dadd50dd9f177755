#include "ddp/launcher/torchelastic_events.hpp"

#include <nlohmann/json.hpp>

namespace ddp::launcher {
namespace {

using nlohmann::ordered_json;

std::string python_dumps(const ordered_json& value);

template <typename T>
ordered_json or_null(const std::optional<T>& value) {
  return value ? ordered_json(*value) : ordered_json(nullptr);
}

// torchrun's _construct_event: the metadata in its order; "metadata" is itself JSON text.
ordered_json metadata(const EventJob& job, const EventAgent& agent, const std::string& state,
                      const ordered_json& inner, std::optional<int> global_rank,
                      std::optional<std::string> worker_id,
                      const std::optional<std::string>& raw_error,
                      std::optional<double> duration_ms) {
  ordered_json m;
  m["run_id"] = job.run_id;
  m["global_rank"] = or_null(global_rank);
  m["group_rank"] = or_null(agent.group_rank);
  m["worker_id"] = or_null(worker_id);
  m["role"] = job.role;
  m["hostname"] = job.hostname;
  m["state"] = state;
  m["total_run_time"] = 0;
  m["rdzv_backend"] = job.rdzv_backend;
  m["raw_error"] = or_null(raw_error);
  m["metadata"] = python_dumps(inner);
  m["agent_restarts"] = agent.restarts;
  m["duration_ms"] = or_null(duration_ms);
  return m;
}

// Python's json.dumps: ", " between items and ": " after keys, so that a line reads as
// torchrun's.
std::string python_dumps(const ordered_json& value) {
  std::string out;
  if (value.is_object()) {
    out += '{';
    for (auto it = value.begin(); it != value.end(); ++it) {
      if (it != value.begin()) out += ", ";
      out += ordered_json(it.key()).dump() + ": " + python_dumps(it.value());
    }
    return out + '}';
  }
  if (value.is_array()) {
    out += '[';
    for (std::size_t i = 0; i < value.size(); ++i) {
      if (i != 0) out += ", ";
      out += python_dumps(value[i]);
    }
    return out + ']';
  }
  return value.dump();
}

std::string line(const std::string& state, const char* source, ordered_json meta) {
  ordered_json event;
  event["name"] = "torchelastic.worker.status." + state;
  event["source"] = source;
  event["timestamp"] = 0;
  event["metadata"] = std::move(meta);
  return python_dumps(event);
}

ordered_json inner_metadata(const EventJob& job, const EventAgent& agent) {
  ordered_json inner;
  inner["group_world_size"] = or_null(agent.group_world_size);
  inner["entry_point"] = job.entry_point;
  return inner;
}

}  // namespace

std::string agent_event(const EventJob& job, const EventAgent& agent, const std::string& state,
                        std::optional<double> duration_ms, std::optional<std::string> raw_error) {
  return line(state, "AGENT",
              metadata(job, agent, state, inner_metadata(job, agent), std::nullopt, std::nullopt,
                       raw_error, duration_ms));
}

std::string worker_event(const EventJob& job, const EventAgent& agent, const std::string& state,
                         const EventWorker& worker) {
  ordered_json inner = inner_metadata(job, agent);
  // torchrun writes these four as one-element lists.
  inner["local_rank"] = ordered_json::array({worker.local_rank});
  inner["role_rank"] = ordered_json::array({worker.role_rank});
  inner["role_world_size"] = ordered_json::array({worker.role_world_size});
  inner["exit_code"] = ordered_json::array({or_null(worker.exit_code)});
  inner["worker_pid"] = ordered_json::array({or_null(worker.failure_pid)});
  return line(state, "WORKER",
              metadata(job, agent, state, inner, worker.rank, std::to_string(worker.pid),
                       worker.raw_error, std::nullopt));
}

}  // namespace ddp::launcher
