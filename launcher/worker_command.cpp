#include "ddp/launcher/worker_command.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include "ddp/launcher/cli.hpp"

namespace ddp::launcher {
namespace {

bool is_executable_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

bool is_readable_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), R_OK) == 0;
}

}  // namespace

std::optional<std::string> find_executable(const std::string& name, const std::string& path) {
  if (name.empty()) return std::nullopt;
  if (name.find('/') != std::string::npos) {
    return is_executable_file(name) ? std::optional(name) : std::nullopt;
  }
  std::size_t start = 0;
  for (;;) {
    std::size_t end = path.find(':', start);
    std::string dir = path.substr(start, end - start);
    std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (is_executable_file(candidate)) return candidate;
    if (end == std::string::npos) return std::nullopt;
    start = end + 1;
  }
}

WorkerCommand resolve_worker_command(const LaunchConfig& config, const EnvLookup& getenv) {
  const std::string path = getenv("PATH").value_or("/usr/local/bin:/usr/bin:/bin");
  const std::string& entry = config.entrypoint;
  bool python = config.entrypoint_kind == EntrypointKind::kModule ||
                (config.entrypoint_kind == EntrypointKind::kAuto &&
                 (entry.ends_with(".py") || config.run_path));
  WorkerCommand command;
  if (!python) {
    auto program = find_executable(entry, path);
    if (!program) {
      throw UsageError("entrypoint '" + entry + "' is not an executable file" +
                       (entry.find('/') == std::string::npos ? " on PATH" : ""));
    }
    command.program = *program;
    command.argv = {entry};
  } else {
    std::string interpreter = getenv("PYTHON_EXEC").value_or("python3");
    auto program = find_executable(interpreter, path);
    if (!program) {
      throw UsageError("python interpreter '" + interpreter +
                       "' not found (set PYTHON_EXEC or put python3 on PATH)");
    }
    command.program = *program;
    command.argv = {interpreter, "-u"};
    if (config.entrypoint_kind == EntrypointKind::kModule) {
      command.argv.push_back("-m");
    } else if (!is_readable_file(entry)) {
      throw UsageError("entrypoint '" + entry + "' is not a readable file");
    }
    command.argv.push_back(entry);
  }
  command.args_begin = command.argv.size();
  command.argv.insert(command.argv.end(), config.entrypoint_args.begin(),
                      config.entrypoint_args.end());
  return command;
}

std::vector<std::string> worker_argv(const WorkerCommand& command, const LaunchConfig& config,
                                     int local_rank) {
  std::vector<std::string> argv = command.argv;
  if (config.legacy_local_rank) {
    argv.insert(argv.begin() + static_cast<std::ptrdiff_t>(command.args_begin),
                "--local_rank=" + std::to_string(local_rank));
  }
  return argv;
}

}  // namespace ddp::launcher
