#include "ddp/launcher/cli.hpp"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "cli/cli_options.hpp"
#include "ddp/common/host_name.hpp"
#include "ddp/launcher/device_count.hpp"
#include "ddp/launcher/rdzv_settings.hpp"
#include "ddp/launcher/signal_names.hpp"
#include "ddp/launcher/slurm_env.hpp"

namespace ddp::launcher {
namespace {

using detail::RawOptions;

std::optional<long> to_long(const std::string& text) {
  if (text.empty()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  long value = std::strtol(text.c_str(), &end, 10);
  if (*end != '\0' || errno == ERANGE) return std::nullopt;
  return value;
}

// "--max_restarts=abc" or "PET_MAX_RESTARTS=abc", for error messages.
std::string where(const RawOptions& raw, const std::string& dest) {
  auto it = raw.origin.find(dest);
  std::string name = it == raw.origin.end() ? "--" + dest : it->second;
  return name + "=" + raw.values.at(dest);
}

int int_option(const RawOptions& raw, const std::string& dest, long min, long max) {
  auto value = to_long(raw.values.at(dest));
  const std::string expected =
      ": expected an integer from " + std::to_string(min) + " to " + std::to_string(max);
  if (!value) throw CommandLineError(where(raw, dest) + expected);  // argparse's type=int
  if (*value < min || *value > max) throw UsageError(where(raw, dest) + expected);
  return static_cast<int>(*value);
}

double seconds_option(const RawOptions& raw, const std::string& dest) {
  const std::string& text = raw.values.at(dest);
  char* end = nullptr;
  double value = text.empty() ? -1 : std::strtod(text.c_str(), &end);
  const std::string expected = ": expected a number of seconds >= 0";
  if (text.empty() || *end != '\0') throw CommandLineError(where(raw, dest) + expected);
  if (!(value >= 0) || value > 1e9) throw UsageError(where(raw, dest) + expected);
  return value;
}

// A name that ends up in a directory name or a console prefix: --rdzv_id, --role.
void check_name(const RawOptions& raw, const std::string& dest, bool path_component) {
  const std::string& name = raw.values.at(dest);
  for (char c : name) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      throw UsageError(where(raw, dest) +
                       ": control characters (such as a newline) are not "
                       "allowed in this name");
    }
  }
  if (path_component && (name.find('/') != std::string::npos || name == "." || name == "..")) {
    throw UsageError(where(raw, dest) +
                     ": names the run's log directory, so it may not "
                     "contain '/' or be '.' or '..'");
  }
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  for (;;) {
    std::size_t end = text.find(sep, start);
    parts.push_back(text.substr(start, end - start));
    if (end == std::string::npos) return parts;
    start = end + 1;
  }
}

void parse_nnodes(const RawOptions& raw, LaunchConfig& config) {
  const std::string& text = raw.values.at("nnodes");
  auto parts = split(text, ':');
  auto min = to_long(parts[0]);
  auto max = parts.size() == 2 ? to_long(parts[1]) : min;
  if (parts.size() > 2 || !min || !max || *min < 1 || *max < 1 || *max > 100000) {
    throw UsageError(where(raw, "nnodes") + ": expected N or MIN:MAX with 1 <= MIN <= MAX");
  }
  if (*min > *max) throw UsageError(where(raw, "nnodes") + ": MIN is greater than MAX");
  config.min_nodes = static_cast<int>(*min);
  config.max_nodes = static_cast<int>(*max);
}

void parse_nproc(const RawOptions& raw, const CliContext& context, LaunchConfig& config) {
  const std::string& text = raw.values.at("nproc_per_node");
  config.nproc_per_node_spec = text;
  if (text == "cpu") {
    config.nproc_per_node = context.cpu_count();
  } else if (text == "gpu") {
    config.nproc_per_node = context.gpu_count();
    if (config.nproc_per_node <= 0) {
      throw UsageError(where(raw, "nproc_per_node") + ": " + no_gpu_message());
    }
  } else if (text == "auto") {
    int gpus = context.gpu_count();
    config.nproc_per_node = gpus > 0 ? gpus : context.cpu_count();
  } else {
    auto n = to_long(text);
    if (!n || *n < 1 || *n > 4096) {
      throw UsageError(where(raw, "nproc_per_node") +
                       ": expected a number of workers (1-4096), cpu, gpu or auto");
    }
    config.nproc_per_node = static_cast<int>(*n);
  }
}

std::string random_uuid() {
  std::random_device rd;
  std::uniform_int_distribution<int> digit(0, 15);
  std::string uuid = "xxxxxxxx-xxxx-4xxx-yxxx-xxxxxxxxxxxx";
  const char* hex = "0123456789abcdef";
  for (char& c : uuid) {
    if (c == 'x') c = hex[digit(rd)];
    if (c == 'y') c = hex[8 + digit(rd) % 4];
  }
  return uuid;
}

void parse_rendezvous(const RawOptions& raw, LaunchConfig& config) {
  config.standalone = raw.flags.at("standalone");
  config.store_allow_any = raw.flags.at("store_allow_any");
  config.rdzv_backend = raw.values.at("rdzv_backend");
  config.rdzv_endpoint = raw.values.at("rdzv_endpoint");
  config.rdzv_id = raw.values.at("rdzv_id");
  if (config.standalone) {  // torchrun: a local c10d rendezvous with a fresh id
    config.rdzv_backend = "c10d";
    config.rdzv_endpoint = "localhost:0";
    config.rdzv_id = random_uuid();
  } else {
    check_name(raw, "rdzv_id", true);
  }
  const std::string& conf = raw.values.at("rdzv_conf");
  if (!conf.empty()) {
    for (const std::string& pair : split(conf, ',')) {
      std::size_t eq = pair.find('=');
      if (eq == 0 || eq == std::string::npos) {
        throw UsageError(where(raw, "rdzv_conf") + ": expected KEY=VALUE pairs separated by ','");
      }
      config.rdzv_conf[pair.substr(0, eq)] = pair.substr(eq + 1);
    }
  }
  config.master_addr = raw.values.at("master_addr");
  if (raw.origin.contains("master_port")) {
    config.master_port = int_option(raw, "master_port", 0, 65535);
  }
  config.local_addr = raw.values.at("local_addr");
  // torchrun 2.x: one node with neither an endpoint nor a master port runs a local c10d
  // rendezvous with a fresh run id, so every run has its own TORCHELASTIC_RUN_ID (and log
  // directory name). ddprun keeps an id the user gave (torchrun replaces it).
  if (!config.standalone && config.rdzv_backend == "static" && config.rdzv_endpoint.empty() &&
      !config.master_port && config.max_nodes == 1 && !raw.origin.contains("rdzv_id")) {
    config.rdzv_id = random_uuid();
  }
  if (!config.standalone && config.rdzv_backend == "static" && !config.rdzv_endpoint.empty()) {
    // torchrun: the static rendezvous's endpoint is the master (MASTER_ADDR:MASTER_PORT), on
    // one node as on several.
    const HostPort master = parse_host_port("--rdzv_endpoint", config.rdzv_endpoint,
                                            config.master_port.value_or(kDefaultMasterPort));
    if (!master.host.empty()) config.master_addr = master.host;
    config.master_port = master.port;
  }
}

// Backends ddprun does not have are refused here, by name; multi-node options are checked
// further when the agent builds its rendezvous (rdzv_settings.hpp).
void check_rendezvous(const RawOptions& raw, LaunchConfig& config) {
  const std::string& backend = config.rdzv_backend;
  if (backend != "static" && backend != "c10d" && backend != "etcd" && backend != "etcd-v2") {
    throw UsageError("--rdzv_backend=" + backend +
                     ": unknown rendezvous backend (static, c10d, etcd, etcd-v2)");
  }
  if (config.standalone && config.max_nodes > 1) {
    throw UsageError(where(raw, "nnodes") +
                     ": --standalone runs one node; for several, give each node "
                     "--rdzv_backend=c10d --rdzv_endpoint=HOST:PORT instead");
  }
  config.node_rank = int_option(raw, "node_rank", 0, 100000);
  if (config.node_rank >= config.max_nodes) {
    throw UsageError(where(raw, "node_rank") + ": must be less than --nnodes (" +
                     std::to_string(config.max_nodes) + ")");
  }
}

void parse_lifecycle(const RawOptions& raw, LaunchConfig& config) {
  config.max_restarts = int_option(raw, "max_restarts", 0, 1000000);
  if (const std::string& policy = raw.values.at("restart_policy"); policy == "none") {
    config.restart_policy = RestartPolicy::kNone;
  } else if (policy == "inplace") {
    config.restart_policy = RestartPolicy::kInplace;
  } else if (policy != "all") {
    throw UsageError(where(raw, "restart_policy") + ": '" + policy +
                     "' is not one of all, inplace, none");
  }
  config.monitor_interval_s = seconds_option(raw, "monitor_interval");
  config.start_method = raw.values.at("start_method");
  if (config.start_method != "spawn" && config.start_method != "fork" &&
      config.start_method != "forkserver") {
    throw UsageError(where(raw, "start_method") + ": expected spawn, fork or forkserver");
  }
  config.role = raw.values.at("role");
  check_name(raw, "role", false);
  for (const std::string& name : split(raw.values.at("signals_to_handle"), ',')) {
    auto number = signal_number(name);
    if (!number || name == "SIGKILL" || name == "SIGSTOP" || name == "SIGCHLD") {
      throw UsageError(where(raw, "signals_to_handle") + ": '" + name +
                       "' is not a signal ddprun can handle (e.g. SIGTERM,SIGINT)");
    }
    config.signals_to_handle.push_back(*number);
  }
  auto ms = static_cast<long long>(seconds_option(raw, "shutdown_timeout") * 1000.0);
  config.shutdown_timeout = std::chrono::milliseconds(ms);
  if (const std::string& code = raw.values.at("exit_code"); code == "root_cause") {
    config.root_cause_exit_code = true;
  } else if (code != "torchrun") {
    throw UsageError(where(raw, "exit_code") + ": '" + code +
                     "' is not one of torchrun, root_cause");
  }
  ms = static_cast<long long>(seconds_option(raw, "hang_timeout") * 1000.0);
  config.hang_timeout = std::chrono::milliseconds(ms);
  if (!raw.values.at("hang_stop_timeout").empty()) {
    ms = static_cast<long long>(seconds_option(raw, "hang_stop_timeout") * 1000.0);
    config.hang_stop_timeout = std::chrono::milliseconds(ms);
  }
  config.straggler_window = int_option(raw, "straggler_window", 0, 64);
  config.straggler_threshold_s = seconds_option(raw, "straggler_threshold");
}

// torchrun's comma_separated_list: "a,b" is two texts, ",," a comma inside one. Empty: none.
std::vector<std::string> filter_list(const std::string& value) {
  std::vector<std::string> texts;
  if (value.empty()) return texts;
  std::string text;
  for (std::size_t i = 0; i < value.size(); ++i) {
    if (value[i] != ',') {
      text += value[i];
    } else if (i + 1 < value.size() && value[i + 1] == ',') {
      text += ',';
      ++i;
    } else {
      texts.push_back(std::move(text));
      text.clear();
    }
  }
  texts.push_back(std::move(text));
  return texts;
}

void parse_logs(const RawOptions& raw, LaunchConfig& config) {
  if (!raw.values.at("log_dir").empty()) config.log_dir = raw.values.at("log_dir");
  if (!raw.values.at("trace_file").empty()) config.trace_file = raw.values.at("trace_file");
  config.redirects = parse_std_spec(where(raw, "redirects"), raw.values.at("redirects"));
  config.tee = parse_std_spec(where(raw, "tee"), raw.values.at("tee"));
  const std::string& filter = raw.values.at("local_ranks_filter");
  if (!filter.empty()) {
    std::set<int> ranks;
    for (const std::string& part : split(filter, ',')) {
      auto rank = to_long(part);
      if (!rank || *rank < 0 || *rank > 100000) {
        throw UsageError(where(raw, "local_ranks_filter") + ": expected local ranks like 0,1,2");
      }
      if (*rank >= config.nproc_per_node) {
        throw UsageError(where(raw, "local_ranks_filter") + ": there is no local rank " + part +
                         " with " + std::to_string(config.nproc_per_node) +
                         " workers per node (local ranks 0-" +
                         std::to_string(config.nproc_per_node - 1) + ")");
      }
      ranks.insert(static_cast<int>(*rank));
    }
    config.local_ranks_filter = ranks;
  }
  const std::string& specs = raw.values.at("logs_specs");
  if (!specs.empty() && specs != "default") {  // torchrun's own entry point: the layout above
    throw NotImplementedError(where(raw, "logs_specs") +
                              ": ddprun cannot load Python LogsSpecs plug-ins; only 'default' "
                              "(torchrun's own layout) is built in. Use --log_dir, "
                              "--redirects, --tee and --local_ranks_filter");
  }
  config.log_line_prefix_template = raw.values.at("log_line_prefix_template");
  config.duplicate_stdout_filters = filter_list(raw.values.at("duplicate_stdout_filters"));
  config.duplicate_stderr_filters = filter_list(raw.values.at("duplicate_stderr_filters"));
  config.event_log_handler = raw.values.at("event_log_handler");
  if (config.event_log_handler != "null" && config.event_log_handler != "console" &&
      config.event_log_handler != "dynamic_rendezvous") {
    throw UsageError(where(raw, "event_log_handler") +
                     ": not one of torchrun's event handlers (null, console, "
                     "dynamic_rendezvous); handlers registered from Python cannot be loaded "
                     "by ddprun");
  }
}

void parse_binding(const RawOptions& raw, LaunchConfig& config) {
  config.virtual_local_rank = raw.flags.at("virtual_local_rank");
  config.numa_binding = raw.values.at("numa_binding");
  const std::string& mode = config.numa_binding;
  if (!mode.empty() && mode != "node" && mode != "socket" && mode != "exclusive" &&
      mode != "core-complex") {
    throw UsageError(where(raw, "numa_binding") +
                     ": expected node, socket, exclusive or core-complex");
  }
}

void parse_entrypoint(const RawOptions& raw, LaunchConfig& config) {
  const std::vector<std::string>& command = raw.command;
  bool module = raw.flags.at("module");
  bool no_python = raw.flags.at("no_python");
  config.run_path = raw.flags.at("run_path");
  config.legacy_local_rank = raw.flags.at("legacy_local_rank");
  config.python_probe = !raw.flags.at("skip_python_probe");
  const std::string& warm = raw.values.at("warm_start");
  if (warm == "auto") {  // parse_lifecycle ran: the policy is known
    config.warm_start =
        config.restart_policy == RestartPolicy::kInplace ? WarmStart::kRestart : WarmStart::kOff;
  } else if (warm == "off") {
    config.warm_start = WarmStart::kOff;
  } else if (warm == "restart") {
    config.warm_start = WarmStart::kRestart;
  } else if (warm == "always") {
    config.warm_start = WarmStart::kAlways;
  } else {
    throw UsageError(where(raw, "warm_start") + ": '" + warm +
                     "' is not one of auto, off, restart, always");
  }
  for (const std::string& name : split(raw.values.at("warm_preload"), ',')) {
    if (name.empty()) continue;
    const bool dotted_name =
        std::all_of(name.begin(), name.end(),
                    [](unsigned char c) { return std::isalnum(c) || c == '_' || c == '.'; }) &&
        !std::isdigit(static_cast<unsigned char>(name.front())) && name.front() != '.' &&
        name.back() != '.' && name.find("..") == std::string::npos;
    if (!dotted_name) {
      throw UsageError(where(raw, "warm_preload") + ": '" + name +
                       "' is not a module name (expected names like transformers,numpy.linalg)");
    }
    config.warm_preload.push_back(name);
  }
  if (module && no_python) {
    throw UsageError("--module and --no_python cannot be used together");
  }
  if (module) config.entrypoint_kind = EntrypointKind::kModule;
  if (no_python && !config.run_path) config.entrypoint_kind = EntrypointKind::kDirect;
  if (command.empty() || command.front().empty()) {
    throw CommandLineError(
        "missing entrypoint: give the script, module or program each worker "
        "runs (see ddprun --help)");
  }
  config.entrypoint = command.front();
  config.entrypoint_args.assign(command.begin() + 1, command.end());
}

}  // namespace

StdSpec parse_std_spec(const std::string& option, const std::string& value) {
  auto digit = [&](const std::string& text) {
    if (text.size() != 1 || text[0] < '0' || text[0] > '3') {
      throw UsageError(option +
                       ": expected 0-3 or a map like 0:1,1:2 (0 none, 1 stdout, "
                       "2 stderr, 3 both)");
    }
    return static_cast<Std>(text[0] - '0');
  };
  StdSpec spec;
  if (value.find(':') == std::string::npos) {
    spec.all = digit(value);
    return spec;
  }
  for (const std::string& pair : split(value, ',')) {
    std::size_t colon = pair.find(':');
    auto rank = to_long(pair.substr(0, colon));
    if (colon == std::string::npos || !rank || *rank < 0) digit("bad");
    spec.per_rank[static_cast<int>(*rank)] = digit(pair.substr(colon + 1));
  }
  return spec;
}

CliContext process_cli_context() {
  CliContext context;
  context.gpu_count = [] { return gpu_device_count(); };
  context.cpu_count = [] {
    return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  };
  context.getenv = [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    return value ? std::optional<std::string>(value) : std::nullopt;
  };
  return context;
}

// Inside a Slurm job, the options the user did not give (on the command line or as PET_*)
// come from SLURM_* (slurm_env.hpp). Returns the line that says what was taken, or "".
static std::string apply_slurm_defaults(const CliContext& context, RawOptions& raw) {
  if (!context.getenv || raw.flags["standalone"]) return "";  // --standalone: this host only
  try {
    std::optional<SlurmDefaults> slurm = slurm_defaults(context.getenv);
    if (!slurm) return "";
    SlurmDefaults taken = slurm->without(
        [&](std::string_view dest) { return raw.origin.contains(std::string(dest)); });
    taken.check_started_by_srun();
    for (const SlurmOption& option : taken.options()) {
      raw.values[option.dest] = option.value;
      raw.origin[option.dest] = option.source;  // errors then name "SLURM_NNODES=..."
    }
    return taken.options().empty() ? "" : taken.summary();
  } catch (const SlurmEnvError& e) {
    throw UsageError(e.what());
  }
}

// torchrun 2.x: without --shutdown_timeout (or PET_SHUTDOWN_TIMEOUT), the grace period before
// SIGKILL is TORCH_ELASTIC_SHUTDOWN_TIMEOUT's, else 30 s.
static void apply_shutdown_timeout_variable(const CliContext& context, RawOptions& raw) {
  constexpr const char* kVariable = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT";
  if (!context.getenv || raw.origin.contains("shutdown_timeout")) return;
  if (std::optional<std::string> value = context.getenv(kVariable)) {
    raw.values["shutdown_timeout"] = *value;
    raw.origin["shutdown_timeout"] = kVariable;  // errors then name it
  }
}

// torchrun: an empty --log_line_prefix_template (and PET_LOG_LINE_PREFIX_TEMPLATE) falls back
// to TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE.
static void apply_prefix_template_variable(const CliContext& context, RawOptions& raw) {
  constexpr const char* kVariable = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE";
  if (!context.getenv || !raw.values.at("log_line_prefix_template").empty()) return;
  if (std::optional<std::string> value = context.getenv(kVariable)) {
    raw.values["log_line_prefix_template"] = *value;
    raw.origin["log_line_prefix_template"] = kVariable;
  }
}

CliResult parse_command_line(const std::vector<std::string>& args, const CliContext& context) {
  RawOptions raw = detail::parse_raw_options(args);
  CliResult result;
  if (raw.help) return {CliResult::Action::kHelp, {}, help_text(), {}};
  if (raw.version) return {CliResult::Action::kVersion, {}, version_text(), {}};
  // Printed like the help, and only from the command line (torchrun takes no
  // PET_PRINT_COMPLETION).
  if (raw.origin.contains("print_completion") &&
      raw.origin.at("print_completion") == "--print_completion") {
    const std::string& shell = raw.values.at("print_completion");
    if (shell != "bash" && shell != "zsh" && shell != "tcsh") {
      throw UsageError(where(raw, "print_completion") + ": expected bash, zsh or tcsh");
    }
    return {CliResult::Action::kHelp, {}, completion_script(shell), {}};
  }
  if (std::string line = apply_slurm_defaults(context, raw); !line.empty()) {
    result.notices.push_back(line);
  }
  apply_shutdown_timeout_variable(context, raw);
  apply_prefix_template_variable(context, raw);
  LaunchConfig& config = result.config;
  parse_nnodes(raw, config);
  parse_rendezvous(raw, config);
  check_rendezvous(raw, config);
  parse_nproc(raw, context, config);
  parse_lifecycle(raw, config);
  parse_logs(raw, config);
  parse_binding(raw, config);
  parse_entrypoint(raw, config);
  return result;
}

}  // namespace ddp::launcher
