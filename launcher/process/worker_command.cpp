#include "ddp/launcher/worker_command.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "ddp/launcher/usage_error.hpp"
#include "process/record_wrapper.hpp"

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

// How much of a file classify() reads: a shebang line, and enough to tell text from binary.
constexpr std::size_t kSniffBytes = 512;

std::string first_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string head(kSniffBytes, '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<std::size_t>(std::max<std::streamsize>(in.gcount(), 0)));
  return head;
}

std::string base_name(const std::string& path) { return path.substr(path.rfind('/') + 1); }

// True for "#!/usr/bin/python3 -u", "#!/usr/bin/env python", "#!/usr/bin/env -S python3 -X".
bool shebang_names_python(const std::string& head) {
  if (!head.starts_with("#!")) return false;
  std::istringstream words(head.substr(2, head.find('\n') - 2));
  std::string word;
  if (!(words >> word)) return false;
  if (base_name(word) == "env") {
    while (words >> word && word.starts_with("-")) {
    }
  }
  return base_name(word).starts_with("python");
}

bool looks_like_text(const std::string& head) { return head.find('\0') == std::string::npos; }

enum class FileKind { kProgram, kPythonScript, kMissing, kNotRunnable };

// The entrypoint rule for a file that is not a .py: executables run directly unless their
// shebang names Python; a non-executable text file is a Python script (as torchrun runs
// every entrypoint with Python); anything else cannot run.
FileKind classify(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return FileKind::kMissing;
  if (!S_ISREG(st.st_mode) || ::access(path.c_str(), R_OK) != 0) {
    return ::access(path.c_str(), X_OK) == 0 && S_ISREG(st.st_mode) ? FileKind::kProgram
                                                                    : FileKind::kNotRunnable;
  }
  const std::string head = first_bytes(path);
  if (::access(path.c_str(), X_OK) == 0) {
    return shebang_names_python(head) ? FileKind::kPythonScript : FileKind::kProgram;
  }
  return looks_like_text(head) ? FileKind::kPythonScript : FileKind::kNotRunnable;
}

// The file an entrypoint names: a program on PATH when the name has no '/', else (or when
// PATH has none) the path itself.
std::string locate(const std::string& entry, const std::string& path) {
  if (entry.find('/') == std::string::npos) {
    if (auto program = find_executable(entry, path)) return *program;
  }
  return entry;
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

namespace {

std::string python_program(const EnvLookup& getenv, const std::string& path,
                           std::string& interpreter) {
  interpreter = getenv("PYTHON_EXEC").value_or("python3");
  auto program = find_executable(interpreter, path);
  if (!program) {
    throw UsageError("python interpreter '" + interpreter +
                     "' not found (set PYTHON_EXEC or put python3 on PATH)");
  }
  return *program;
}

[[noreturn]] void no_such_entrypoint(const std::string& entry) {
  throw UsageError("entrypoint '" + entry + "': no such file" +
                   (entry.find('/') == std::string::npos ? " (nor a program on PATH)" : ""));
}

// The entrypoint as the file a worker runs: a program, or a script for Python.
struct ResolvedEntry {
  std::string file;
  bool python = false;
};

ResolvedEntry resolve_entry(const LaunchConfig& config, const std::string& path) {
  const std::string& entry = config.entrypoint;
  if (config.entrypoint_kind == EntrypointKind::kModule) return {entry, true};
  if (config.entrypoint_kind == EntrypointKind::kAuto &&
      (entry.ends_with(".py") || config.run_path)) {
    if (!is_readable_file(entry)) {
      if (::access(entry.c_str(), F_OK) != 0) no_such_entrypoint(entry);
      throw UsageError("entrypoint '" + entry + "' is not a readable file");
    }
    return {entry, true};
  }
  if (config.entrypoint_kind == EntrypointKind::kDirect) {  // --no_python
    auto program = find_executable(entry, path);
    if (program) return {*program, false};
    if (::access(locate(entry, path).c_str(), F_OK) != 0) no_such_entrypoint(entry);
    throw UsageError("entrypoint '" + entry +
                     "' is not an executable file (--no_python runs "
                     "it directly)");
  }
  const std::string file = locate(entry, path);
  switch (classify(file)) {
    case FileKind::kProgram:
      return {file, false};
    case FileKind::kPythonScript:
      return {file, true};
    case FileKind::kMissing:
      no_such_entrypoint(entry);
    case FileKind::kNotRunnable:
      break;
  }
  throw UsageError("entrypoint '" + entry +
                   "' is neither an executable file nor a text file "
                   "Python could run");
}

}  // namespace

WorkerCommand resolve_worker_command(const LaunchConfig& config, const EnvLookup& getenv) {
  const std::string path = getenv("PATH").value_or("/usr/local/bin:/usr/bin:/bin");
  const ResolvedEntry entry = resolve_entry(config, path);
  WorkerCommand command;
  if (!entry.python) {
    command.program = entry.file;
    command.argv = {config.entrypoint};
  } else {
    std::string interpreter;
    command.program = python_program(getenv, path, interpreter);
    command.argv = {interpreter, "-u"};
    command.python = true;
    const bool module = config.entrypoint_kind == EntrypointKind::kModule;
    if (module) {  // as torchrun: the interpreter's own -m (sys.path[0], tracebacks); the
      command.argv.push_back("-m");  // probe writes its error file (_ddprun_probe.py)
    } else if (config.run_path) {    // torchrun's @record, by ddprun's wrapper
      command.argv.push_back("-c");
      command.argv.push_back(std::string(detail::record_wrapper_source()));
      command.argv.push_back("--run_path");
    }
    command.argv.push_back(module ? config.entrypoint : entry.file);
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
