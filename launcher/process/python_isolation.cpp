#include "process/python_isolation.hpp"

#include <fstream>
#include <sstream>

#include "shared/tool_run.hpp"

namespace ddp::launcher {
namespace {

// What the interpreter is asked, and the tag its answer starts with (a wrapper may print
// lines of its own first).
constexpr const char* kTag = "ddprun-python-flags";
constexpr const char* kQuery =
    "import sys; f = sys.flags; "
    "print('ddprun-python-flags', f.isolated, f.ignore_environment, f.no_site)";

// A binary (ELF) interpreter runs with the flags on ddprun's command line; only a script can
// add its own.
bool is_binary(const std::string& program) {
  std::ifstream in(program, std::ios::binary);
  char magic[4] = {};
  in.read(magic, sizeof magic);
  return in.gcount() == 4 && magic[0] == 0x7f && magic[1] == 'E' && magic[2] == 'L' &&
         magic[3] == 'F';
}

// The flag of the answer's line: isolated, ignore_environment, no_site.
std::string flag_of(const std::string& output) {
  const auto at = output.rfind(kTag);
  if (at == std::string::npos) return "";
  std::istringstream fields(output.substr(at + std::string(kTag).size()));
  int isolated = 0, ignore_environment = 0, no_site = 0;
  if (!(fields >> isolated >> ignore_environment >> no_site)) return "";
  if (isolated) return "-I";
  if (ignore_environment) return "-E";
  return no_site ? "-S" : "";
}

}  // namespace

std::string python_isolation_flag(const WorkerCommand& command, std::chrono::milliseconds timeout) {
  if (!command.python || is_binary(command.program)) return "";
  const ToolRun run = run_tool({command.program, "-c", kQuery}, timeout, 64 * 1024);
  return run.succeeded() ? flag_of(run.output) : "";
}

std::string python_isolation_notice(const std::string& flag, const WorkerCommand& command,
                                    const LaunchConfig& config) {
  const std::string what = flag == "-S" ? "runs Python without the site module (-S), so no "
                                          "sitecustomize runs"
                           : flag == "-E"
                               ? "runs Python ignoring the PYTHON* variables (-E), PYTHONPATH "
                                 "among them"
                               : "runs Python isolated (-I), ignoring PYTHONPATH";
  return "ddprun: the workers' interpreter (" + command.argv.at(0) + ") " + what +
         ": ddprun's Python probe cannot load there, so the workers get torchrun's environment "
         "alone: no collective records, hang verdicts, live stacks or Flight Recorder dumps "
         "from them" +
         (config.warm_start == WarmStart::kOff ? ""
                                               : ", and no warm starts (every worker is exec'd)");
}

}  // namespace ddp::launcher
