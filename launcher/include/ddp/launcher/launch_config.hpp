#pragma once
// LaunchConfig: everything the agent needs to start a job, parsed and validated from
// torchrun's options (see cli.hpp). A plain value: copy it, compare it, print it.

#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace ddp::launcher {

// Which of a worker's standard streams an -r/--redirects or -t/--tee value selects
// (torchrun's Std: 0 none, 1 stdout, 2 stderr, 3 both).
enum class Std { kNone = 0, kOut = 1, kErr = 2, kAll = 3 };

bool selects_stdout(Std std);
bool selects_stderr(Std std);

// A --redirects or --tee value: one Std for every local rank ("3") or a per-rank map
// ("0:1,1:2"; ranks not named get kNone).
struct StdSpec {
  std::optional<Std> all;       // set when the value was a single digit
  std::map<int, Std> per_rank;  // set when the value was a map
  Std for_rank(int local_rank) const;
  bool operator==(const StdSpec&) const = default;
};

// Which Python workers a per-node warm template forks (--warm_start; auto is resolved to one of
// these by the policy: kRestart under inplace, else kOff).
enum class WarmStart {
  kOff,      // every worker is exec'd
  kRestart,  // restarts are forked from a template that imported torch (and --warm_preload's)
  kAlways,   // the first attempt too
};

// How a worker's entrypoint is run.
enum class EntrypointKind {
  kAuto,    // ".py" -> python3 -u FILE; anything else runs directly
  kModule,  // -m: python3 -u -m NAME
  kDirect,  // --no_python: run the entrypoint as an executable
};

// --restart_policy: what a worker's exit does to the others.
enum class RestartPolicy {
  kAll,   // stop the whole group, restart it while --max_restarts allows (torchrun's)
  kNone,  // nothing: the others go on; the job ends once every worker has exited
  // the others go on; the failed worker is replaced in the running round, and the program
  // (ddprun.inplace) re-forms its process group with it; else as kAll (docs/inplace.md)
  kInplace,
};

struct LaunchConfig {
  // Node and worker counts.
  int min_nodes = 1;                      // --nnodes (MIN of MIN:MAX)
  int max_nodes = 1;                      // --nnodes (MAX of MIN:MAX)
  std::string nproc_per_node_spec = "1";  // --nproc_per_node as given (int, cpu, gpu, auto)
  int nproc_per_node = 1;                 // the resolved number of workers on this node
  int node_rank = 0;                      // --node_rank
  bool virtual_local_rank = false;        // --virtual_local_rank: LOCAL_RANK=0, one GPU each
  std::string numa_binding;               // --numa_binding mode; empty: no binding

  // Rendezvous (single node: recorded, validated, and refused when multi-node).
  bool standalone = false;                       // --standalone
  std::string rdzv_backend = "static";           // --rdzv_backend
  std::string rdzv_endpoint;                     // --rdzv_endpoint (host[:port])
  std::string rdzv_id = "none";                  // --rdzv_id; TORCHELASTIC_RUN_ID
  std::map<std::string, std::string> rdzv_conf;  // --rdzv_conf key=value pairs
  std::string master_addr = "127.0.0.1";         // --master_addr; MASTER_ADDR
  std::optional<int> master_port;  // --master_port when given; else a free port is picked
  std::string local_addr;          // --local_addr; MASTER_ADDR when set
  bool store_allow_any = false;    // --store_allow_any: the stores admit every address

  // Worker lifecycle.
  int max_restarts = 0;                // --max_restarts: group restarts after a failure
  double monitor_interval_s = 5.0;     // --monitor_interval (accepted; the agent is event driven)
  std::string start_method = "spawn";  // --start_method (accepted; --warm_start decides)
  std::string role = "default";        // --role; ROLE_NAME and the tee prefix
  std::vector<int> signals_to_handle;  // --signals_to_handle, as signal numbers
  RestartPolicy restart_policy = RestartPolicy::kAll;                    // --restart_policy
  std::chrono::milliseconds shutdown_timeout{std::chrono::seconds(30)};  // --shutdown_timeout
  bool root_cause_exit_code = false;  // --exit_code=root_cause (default torchrun: 0 or 1)
  // --hang_timeout: no collective finished for this long while one waits: a hang. 0: off.
  std::chrono::milliseconds hang_timeout{std::chrono::seconds(300)};
  // --hang_stop_timeout: an uncertain hang is stopped after this; unset: the job's own
  // collective timeout.
  std::optional<std::chrono::milliseconds> hang_stop_timeout;
  int straggler_window = 20;             // --straggler_window: Reducer steps judged; 0: off
  double straggler_threshold_s = 0.005;  // --straggler_threshold

  // Logs.
  std::optional<std::string> log_dir;               // --log_dir; a temp dir when unset
  std::optional<std::string> trace_file;            // --trace_file: the job's timeline
  StdSpec redirects;                                // -r/--redirects
  StdSpec tee;                                      // -t/--tee
  std::optional<std::set<int>> local_ranks_filter;  // --local_ranks_filter (console only)
  // --log_line_prefix_template (or TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE); empty: torchrun's
  // "[${role_name}${local_rank}]:".
  std::string log_line_prefix_template;
  std::vector<std::string> duplicate_stdout_filters;  // --duplicate_stdout_filters
  std::vector<std::string> duplicate_stderr_filters;  // --duplicate_stderr_filters
  std::string event_log_handler = "null";             // --event_log_handler

  // What each worker runs.
  EntrypointKind entrypoint_kind = EntrypointKind::kAuto;  // -m / --no_python
  bool run_path = false;                     // --run_path (runs like a .py entrypoint)
  bool legacy_local_rank = false;            // --legacy-local-rank: append --local_rank=<n>
  bool python_probe = true;                  // false: --skip_python_probe
  WarmStart warm_start = WarmStart::kOff;    // --warm_start (auto: kRestart under inplace)
  std::vector<std::string> warm_preload;     // --warm_preload: modules beside torch
  std::string entrypoint;                    // script, module or executable
  std::vector<std::string> entrypoint_args;  // everything after the entrypoint, untouched

  bool operator==(const LaunchConfig&) const = default;
};

}  // namespace ddp::launcher
