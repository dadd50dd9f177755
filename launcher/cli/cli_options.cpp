#include "cli/cli_options.hpp"

#include <algorithm>
#include <array>
#include <cctype>

namespace ddp::launcher::detail {
namespace {

constexpr std::string_view kNodes = "Nodes and workers";
constexpr std::string_view kRdzv = "Rendezvous";
constexpr std::string_view kLife = "Failures, restarts and signals";
constexpr std::string_view kLogs = "Logs";
constexpr std::string_view kEntry = "What each worker runs";

// dest, short, dashed, flag, metavar, default, group, help[, may_be_empty]
constexpr std::array kOptions = {
    OptionSpec{"nnodes", "", false, false, "N|MIN:MAX", "1:1", kNodes,
               "Number of nodes, or the range an elastic job (c10d or etcd) may run on. With "
               "1, this node runs alone and contacts no rendezvous."},
    OptionSpec{"nproc_per_node", "", true, false, "N|cpu|gpu|auto", "1", kNodes,
               "Workers on this node: a number, one per core (cpu), one per GPU (gpu), or one "
               "per GPU if there are any, else per core (auto)."},
    OptionSpec{"node_rank", "", true, false, "N", "0", kNodes,
               "Rank of this node (static rendezvous). Below --nnodes."},
    OptionSpec{"virtual_local_rank", "", true, true, "", "", kNodes,
               "Give every worker LOCAL_RANK=0 and only its own GPU as device 0: "
               "CUDA_VISIBLE_DEVICES is the local rank's entry of ddprun's "
               "CUDA_VISIBLE_DEVICES (else the local rank)."},
    OptionSpec{"numa_binding", "", true, false, "node|socket|exclusive|core-complex", "", kNodes,
               "Bind each worker to CPUs near the GPU of its local rank (from sysfs): the GPU's "
               "NUMA node, its socket's NUMA nodes, an exclusive share of the node's cores, or "
               "one L3 core complex. ddprun says what it chose.",
               true},
    OptionSpec{"standalone", "", false, true, "", "", kRdzv,
               "Single-node job with its own rendezvous: picks a free port and a fresh run id; "
               "--rdzv_backend, --rdzv_endpoint and --rdzv_id are ignored."},
    OptionSpec{"rdzv_backend", "", true, false, "NAME", "static", kRdzv,
               "static, c10d, or etcd (etcd-v2 is the same: etcd's v3 API)."},
    OptionSpec{"rdzv_endpoint", "", true, false, "HOST[:PORT]", "", kRdzv,
               "Rendezvous store (c10d: default port 29400; its host's agent serves it), the "
               "etcd members' HOST:PORT[,HOST:PORT...] (default port 2379), or for static the "
               "master in place of --master_addr:--master_port.",
               true},
    OptionSpec{"rdzv_id", "", true, false, "ID", "none", kRdzv,
               "Job id, given to workers as TORCHELASTIC_RUN_ID. One node without "
               "--master_port or --rdzv_endpoint gets a fresh UUID instead (torchrun 2.x)."},
    OptionSpec{"rdzv_conf", "", true, false, "K=V,...", "", kRdzv,
               "Rendezvous settings: join_timeout, last_call_timeout, close_timeout, "
               "keep_alive_interval, keep_alive_max_attempt, read_timeout, timeout, is_host; "
               "etcd: protocol, cacert, cert, key, user, password.",
               true},
    OptionSpec{"master_addr", "", true, false, "ADDR", "127.0.0.1", kRdzv,
               "MASTER_ADDR given to workers."},
    OptionSpec{"master_port", "", true, false, "PORT", "29500", kRdzv,
               "MASTER_PORT given to workers. When not given, one node picks a free port; "
               "several nodes (static rendezvous) use 29500."},
    OptionSpec{"local_addr", "", true, false, "ADDR", "", kRdzv,
               "Address of this node; becomes MASTER_ADDR when given.", true},
    OptionSpec{"store_allow_any", "", true, true, "", "", kRdzv,
               "Let every address connect to the stores this agent serves for the workers "
               "(behind NAT or a proxy); by default only the job's nodes and loopback may."},
    OptionSpec{"max_restarts", "", true, false, "N", "0", kLife,
               "Restarts of the whole worker group after a failure before giving up."},
    OptionSpec{"restart_policy", "", true, false, "all|inplace|none", "all", kLife,
               "What a worker's exit does to the others: stop and restart the whole group "
               "(all, as torchrun); replace only the failed worker while the others keep "
               "running, for programs that use ddprun.inplace (inplace; else as all); or "
               "nothing: the others go on, and the job ends once every worker has exited "
               "(none, for programs that recover by themselves)."},
    OptionSpec{"monitor_interval", "", true, false, "SECONDS", "5", kLife,
               "Accepted for torchrun compatibility; ddprun reacts to events at once."},
    OptionSpec{"start_method", "", true, false, "spawn|fork|forkserver", "spawn", kLife,
               "Accepted for torchrun compatibility; workers are exec'd, or forked from the warm "
               "template (--warm_start)."},
    OptionSpec{"signals_to_handle", "", true, false, "SIG,...", "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
               kLife, "Signals forwarded to every worker's process group."},
    OptionSpec{"shutdown_timeout", "", true, false, "SECONDS", "30", kLife,
               "Grace period between SIGTERM (or the forwarded signal) and SIGKILL. A second "
               "signal never shortens it."},
    OptionSpec{"exit_code", "", true, false, "torchrun|root_cause", "torchrun", kLife,
               "ddprun's exit status when the job fails: 1, as torchrun (torchrun), or the "
               "root cause's exit status: its exit code, 128+N after signal N, 128+N after "
               "ddprun got signal N (root_cause)."},
    OptionSpec{"hang_timeout", "", true, false, "SECONDS", "300", kLife,
               "A job whose ranks (libddp, or PyTorch through ddprun's Python probe) finish no "
               "collective for this long while one waits in one is hung: ddprun warns, naming "
               "the collective and the ranks to blame with each worker's stack, and stops the "
               "job once the hang is certain or --hang_stop_timeout passed. 0: off."},
    OptionSpec{"hang_stop_timeout", "", true, false, "SECONDS", "", kLife,
               "How long ranks may wait in a hung collective before ddprun stops the job, "
               "when the hang is not certain (no rank to blame exited, no desync). Default: "
               "the job's own collective timeout (the process group's, libddp's), else 600.",
               true},
    OptionSpec{"straggler_window", "", true, false, "STEPS", "20", kLife,
               "A libddp rank whose gradients are ready later than the median rank's in most "
               "of the last STEPS Reducer steps is named as a straggler (at most once a "
               "minute). 0: off."},
    OptionSpec{"straggler_threshold", "", true, false, "SECONDS", "0.005", kLife,
               "How much later than the median rank's (and at least 20 % of its compute "
               "time) a step's gradients must be to count as late."},
    OptionSpec{"role", "", false, false, "NAME", "default", kLife,
               "Worker role: ROLE_NAME and the [<role><local_rank>]: prefix of teed lines."},
    OptionSpec{"log_dir", "", true, false, "DIR", "", kLogs,
               "Base directory of <run_id>_<random>/attempt_<n>/<local_rank>/ logs and error "
               "files, a fresh <run_id>_<random> for every run. A temp directory when not "
               "given.",
               true},
    OptionSpec{"redirects", "-r", false, false, "0-3|R:S,...", "0", kLogs,
               "Send workers' streams to log files instead of the console: 1 stdout, 2 "
               "stderr, 3 both, or per local rank as 0:1,1:2."},
    OptionSpec{"tee", "-t", false, false, "0-3|R:S,...", "0", kLogs,
               "Like --redirects, but also show the lines on the console with a prefix."},
    OptionSpec{"local_ranks_filter", "", true, false, "R,...", "", kLogs,
               "Show only these local ranks on the console (log files keep everything).", true},
    OptionSpec{"log_line_prefix_template", "", true, false, "TEMPLATE", "", kLogs,
               "Prefix of teed console lines, with ${role_name}, ${local_rank}, ${rank} and "
               "${hostname} replaced. Default: $TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE, else "
               "[${role_name}${local_rank}]:.",
               true},
    OptionSpec{"duplicate_stdout_filters", "", true, false, "TEXT,...", "", kLogs,
               "Also copy the teed stdout lines (with their prefix) that contain any of these "
               "texts to attempt_<n>/filtered_stdout.log (',,' is a comma in a text).",
               true},
    OptionSpec{"duplicate_stderr_filters", "", true, false, "TEXT,...", "", kLogs,
               "The same for teed stderr lines, into attempt_<n>/filtered_stderr.log.", true},
    OptionSpec{"event_log_handler", "", true, false, "null|console|dynamic_rendezvous", "null",
               kLogs,
               "console: torchelastic's events (rendezvous, each worker's start and end, the "
               "agent's end) as JSON lines on stderr; null and dynamic_rendezvous: none."},
    OptionSpec{"logs_specs", "", true, false, "NAME", "", kLogs,
               "torchrun's LogsSpecs plug-in: only default (the log layout above) is built in.",
               true},
    OptionSpec{"trace_file", "", true, false, "PATH", "", kLogs,
               "Write the job's timeline here at the end, as Chrome Trace Event JSON "
               "(Perfetto, chrome://tracing): the agent's events, each libddp rank's "
               "collectives and Reducer steps.",
               true},
    OptionSpec{"module", "-m", false, true, "", "", kEntry,
               "Run the entrypoint as a Python module: python3 -u -m NAME."},
    OptionSpec{"no_python", "", true, true, "", "", kEntry,
               "Run the entrypoint directly, even if it ends in .py."},
    OptionSpec{"run_path", "", true, true, "", "", kEntry,
               "Run the entrypoint as a Python script (like a .py file)."},
    OptionSpec{"skip_python_probe", "", true, true, "", "", kEntry,
               "Do not load ddprun's Python probe into Python workers (as DDPRUN_PYTHON_PROBE=0 "
               "does): no collective records, hang verdicts or live stacks for PyTorch jobs."},
    OptionSpec{"warm_start", "", true, false, "auto|off|restart|always", "auto", kEntry,
               "Python workers forked from a per-node template that imported torch (and "
               "--warm_preload's modules), never the program: restart (restarts only, where "
               "one can come: --max_restarts above 0 or more than one node), always (the first "
               "attempt too), off (every worker exec'd, as torchrun does), auto (restart under "
               "--restart_policy=inplace, else off). Falls back to exec'd workers, in one line, "
               "when a fork would not match an exec'd worker."},
    OptionSpec{"warm_preload", "", true, false, "MODULE,...", "", kEntry,
               "More modules for the warm template to import beside torch (e.g. "
               "transformers): your promise that their import does nothing per process (reads "
               "no rank's variable, starts no thread, seeds nothing), as multiprocessing's "
               "set_forkserver_preload asks."},
    OptionSpec{"legacy_local_rank", "", true, true, "", "", kEntry,
               "Pass --local_rank=<n> to each worker, before the script's own arguments, as "
               "torch.distributed.launch did."},
    OptionSpec{"print_completion", "", true, false, "bash|zsh|tcsh", "", kEntry,
               "Print a shell completion script for ddprun and exit (bash: eval "
               "\"$(ddprun --print_completion bash)\")."},
};

}  // namespace

std::span<const OptionSpec> option_table() { return kOptions; }

std::string long_name(const OptionSpec& spec) { return "--" + std::string(spec.dest); }

std::string dashed_name(const OptionSpec& spec) {
  std::string name = long_name(spec);
  std::replace(name.begin(), name.end(), '_', '-');
  return name;
}

std::string env_name(const OptionSpec& spec) {
  std::string name = "PET_";
  for (char c : spec.dest) name += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return name;
}

}  // namespace ddp::launcher::detail
