#include "ddp/launcher/cli.hpp"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdlib>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "cli_options.hpp"
#include "ddp/launcher/device_count.hpp"
#include "ddp/launcher/signal_names.hpp"

namespace ddp::launcher {
namespace {

using detail::OptionSpec;
using detail::option_table;

// Option values as text, after defaults, PET_ variables and the command line, in that order.
struct RawOptions {
  std::map<std::string, std::string> values;  // by dest
  std::map<std::string, bool> flags;          // by dest
  std::map<std::string, std::string> origin;  // by dest: "--x" or "PET_X" when set by the user
  bool help = false;
  bool version = false;
};

const OptionSpec* find_option(std::string_view name) {
  for (const OptionSpec& spec : option_table()) {
    if (name == detail::long_name(spec) || name == detail::dashed_name(spec) ||
        (!spec.short_name.empty() && name == spec.short_name)) {
      return &spec;
    }
  }
  return nullptr;
}

// Splits the arguments into the launcher's options and the worker command (entrypoint and
// its arguments, untouched). The entrypoint is the first argument that is neither an option
// nor an option's value, or the one after "--".
std::pair<std::vector<std::string>, std::vector<std::string>> split_arguments(
    const std::vector<std::string>& args) {
  std::vector<std::string> options;
  std::size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') break;
    options.push_back(arg);
    bool is_long = arg[1] == '-';
    bool attached = is_long ? arg.find('=') != std::string::npos : arg.size() > 2;
    const OptionSpec* spec = find_option(is_long ? arg.substr(0, arg.find('=')) : arg.substr(0, 2));
    if (spec && !spec->is_flag && !attached && i + 1 < args.size()) options.push_back(args[++i]);
  }
  return {options, std::vector<std::string>(args.begin() + static_cast<std::ptrdiff_t>(i), args.end())};
}

std::optional<long> to_long(const std::string& text) {
  if (text.empty()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  long value = std::strtol(text.c_str(), &end, 10);
  if (*end != '\0' || errno == ERANGE) return std::nullopt;
  return value;
}

RawOptions defaults_and_environment(const CliContext& context) {
  RawOptions raw;
  for (const OptionSpec& spec : option_table()) {
    std::string dest(spec.dest);
    std::optional<std::string> env = context.getenv ? context.getenv(detail::env_name(spec)) : std::nullopt;
    if (spec.is_flag) {
      raw.flags[dest] = false;
      if (env) {  // torchrun: bool(int(value))
        auto number = to_long(*env);
        if (!number) throw UsageError(detail::env_name(spec) + "=" + *env + ": expected 0 or 1");
        raw.flags[dest] = *number != 0;
      }
    } else {
      raw.values[dest] = std::string(spec.default_value);
      if (env) {
        raw.values[dest] = *env;
        raw.origin[dest] = detail::env_name(spec);
      }
    }
  }
  return raw;
}

// Runs CLI11 over the launcher's own options, filling raw.
void parse_options(std::vector<std::string> options, RawOptions& raw) {
  CLI::App app("ddprun", "ddprun");
  app.set_help_flag();
  app.add_flag("-h,--help", raw.help);
  app.add_flag("--version", raw.version);
  std::map<std::string, CLI::Option*> added;
  for (const OptionSpec& spec : option_table()) {
    std::string names = detail::long_name(spec);
    if (spec.dashed_spelling) names += "," + detail::dashed_name(spec);
    if (!spec.short_name.empty()) names = std::string(spec.short_name) + "," + names;
    std::string dest(spec.dest);
    if (spec.is_flag) {
      added[dest] = app.add_flag(names, raw.flags[dest]);
    } else {
      added[dest] = app.add_option(names, raw.values[dest])
                        ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)
                        ->allow_extra_args(false);
    }
  }
  std::reverse(options.begin(), options.end());  // CLI11 takes them from the back
  try {
    app.parse(options);
  } catch (const CLI::ExtrasError& e) {
    std::string what = e.what();
    throw UsageError("unknown option " + what.substr(what.find(": ") + 2) +
                     " (see ddprun --help)");
  } catch (const CLI::ArgumentMismatch& e) {
    std::string what = e.what();
    throw UsageError(what.substr(0, what.find(':')) + ": needs a value");
  } catch (const CLI::ParseError& e) {
    throw UsageError(e.what());
  }
  for (const auto& [dest, option] : added) {
    if (option->count() > 0) raw.origin[dest] = "--" + dest;
  }
}

// "--max_restarts=abc" or "PET_MAX_RESTARTS=abc", for error messages.
std::string where(const RawOptions& raw, const std::string& dest) {
  auto it = raw.origin.find(dest);
  std::string name = it == raw.origin.end() ? "--" + dest : it->second;
  return name + "=" + raw.values.at(dest);
}


int int_option(const RawOptions& raw, const std::string& dest, long min, long max) {
  auto value = to_long(raw.values.at(dest));
  if (!value || *value < min || *value > max) {
    throw UsageError(where(raw, dest) + ": expected an integer from " + std::to_string(min) +
                     " to " + std::to_string(max));
  }
  return static_cast<int>(*value);
}

double seconds_option(const RawOptions& raw, const std::string& dest) {
  const std::string& text = raw.values.at(dest);
  char* end = nullptr;
  double value = text.empty() ? -1 : std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !(value >= 0) || value > 1e9) {
    throw UsageError(where(raw, dest) + ": expected a number of seconds >= 0");
  }
  return value;
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
  config.rdzv_backend = raw.values.at("rdzv_backend");
  config.rdzv_endpoint = raw.values.at("rdzv_endpoint");
  config.rdzv_id = raw.values.at("rdzv_id");
  if (config.standalone) {  // torchrun: a local c10d rendezvous with a fresh id
    config.rdzv_backend = "c10d";
    config.rdzv_endpoint = "localhost:0";
    config.rdzv_id = random_uuid();
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
}

// Backends ddprun does not have are refused here, by name; multi-node options are checked
// further when the agent builds its rendezvous (rdzv_settings.hpp).
void check_rendezvous(const RawOptions& raw, LaunchConfig& config) {
  const std::string& backend = config.rdzv_backend;
  if (backend == "etcd" || backend == "etcd-v2") {
    throw NotImplementedError("--rdzv_backend=" + backend +
                              ": the etcd rendezvous is not implemented yet (static and "
                              "c10d are)");
  }
  if (backend != "static" && backend != "c10d") {
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
  config.monitor_interval_s = seconds_option(raw, "monitor_interval");
  config.start_method = raw.values.at("start_method");
  if (config.start_method != "spawn" && config.start_method != "fork" &&
      config.start_method != "forkserver") {
    throw UsageError(where(raw, "start_method") + ": expected spawn, fork or forkserver");
  }
  config.role = raw.values.at("role");
  if (config.role.empty()) throw UsageError("--role: the role name must not be empty");
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
}

void parse_logs(const RawOptions& raw, LaunchConfig& config) {
  if (!raw.values.at("log_dir").empty()) config.log_dir = raw.values.at("log_dir");
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
      ranks.insert(static_cast<int>(*rank));
    }
    config.local_ranks_filter = ranks;
  }
  if (!raw.values.at("logs_specs").empty()) {
    throw NotImplementedError(where(raw, "logs_specs") +
                              ": Python LogsSpecs plug-ins are not supported; use --log_dir, "
                              "--redirects, --tee and --local_ranks_filter");
  }
}

void parse_entrypoint(const RawOptions& raw, const std::vector<std::string>& command,
                      LaunchConfig& config) {
  bool module = raw.flags.at("module");
  bool no_python = raw.flags.at("no_python");
  config.run_path = raw.flags.at("run_path");
  config.legacy_local_rank = raw.flags.at("legacy_local_rank");
  if (module && no_python) {
    throw UsageError("--module and --no_python cannot be used together");
  }
  if (module) config.entrypoint_kind = EntrypointKind::kModule;
  if (no_python && !config.run_path) config.entrypoint_kind = EntrypointKind::kDirect;
  if (command.empty() || command.front().empty()) {
    throw UsageError("missing entrypoint: give the script, module or program each worker "
                     "runs (see ddprun --help)");
  }
  config.entrypoint = command.front();
  config.entrypoint_args.assign(command.begin() + 1, command.end());
}

}  // namespace

StdSpec parse_std_spec(const std::string& option, const std::string& value) {
  auto digit = [&](const std::string& text) {
    if (text.size() != 1 || text[0] < '0' || text[0] > '3') {
      throw UsageError(option + ": expected 0-3 or a map like 0:1,1:2 (0 none, 1 stdout, "
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
  context.getenv = [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    return value ? std::optional<std::string>(value) : std::nullopt;
  };
  context.gpu_count = [] { return gpu_device_count(); };
  context.cpu_count = [] { return static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); };
  return context;
}

CliResult parse_command_line(const std::vector<std::string>& args, const CliContext& context) {
  auto [options, command] = split_arguments(args);
  RawOptions raw = defaults_and_environment(context);
  parse_options(options, raw);
  CliResult result;
  if (raw.help) return {CliResult::Action::kHelp, {}, help_text()};
  if (raw.version) return {CliResult::Action::kVersion, {}, version_text()};
  LaunchConfig& config = result.config;
  parse_nnodes(raw, config);
  parse_rendezvous(raw, config);
  check_rendezvous(raw, config);
  parse_nproc(raw, context, config);
  parse_lifecycle(raw, config);
  parse_logs(raw, config);
  parse_entrypoint(raw, command, config);
  return result;
}

}  // namespace ddp::launcher
