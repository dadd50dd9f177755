#pragma once
// How every worker runs the entrypoint: a .py script under python3 -u, a module under
// python3 -u -m, or a program executed directly.

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ddp/launcher/launch_config.hpp"

namespace ddp::launcher {

struct WorkerCommand {
  std::string program;            // the file to execute, resolved against PATH
  std::vector<std::string> argv;  // argv[0] onwards, the same for every worker
  std::size_t args_begin = 0;     // index in argv of the entrypoint's first argument
  bool python = false;            // a Python script or module (under the interpreter)
};

using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;

// Resolves the command from config (interpreter from PYTHON_EXEC, else python3 on PATH) and
// checks that the interpreter, script or program exists, so that a typo fails before any
// worker starts. Throws UsageError naming what is missing.
WorkerCommand resolve_worker_command(const LaunchConfig& config, const EnvLookup& getenv);

// The command of one worker. --legacy-local-rank puts --local_rank=<n> right after the
// entrypoint, before its arguments, as torch.distributed.launch did.
std::vector<std::string> worker_argv(const WorkerCommand& command, const LaunchConfig& config,
                                     int local_rank);

// The executable `name` would run as: itself when it contains '/', else the first match on
// `path` (a PATH value). nullopt when not found or not executable.
std::optional<std::string> find_executable(const std::string& name, const std::string& path);

}  // namespace ddp::launcher
