#pragma once
// The command line: torchrun's options (both spellings, argparse's unambiguous prefixes,
// PET_<OPTION> defaults from the process environment) parsed with CLI11 into a validated
// LaunchConfig. The machine's device counts come in through CliContext, so tests run it
// in-process.

#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "ddp/launcher/launch_config.hpp"
#include "ddp/launcher/usage_error.hpp"

namespace ddp::launcher {

// What parsing needs from the outside world.
struct CliContext {
  std::function<int()> gpu_count;  // devices visible for --nproc_per_node=gpu|auto
  std::function<int()> cpu_count;  // cores for --nproc_per_node=cpu|auto
  // The environment for Slurm's defaults (SLURM_JOB_ID, SLURM_NNODES, ...); unset: none.
  std::function<std::optional<std::string>(const std::string&)> getenv;
};

// The real GPU probe (device_count.hpp) and core count.
CliContext process_cli_context();

struct CliResult {
  enum class Action { kRun, kHelp, kVersion };  // kHelp: print text (help, completion), exit 0
  Action action = Action::kRun;
  LaunchConfig config;               // valid when action == kRun
  std::string text;                  // the help or version text otherwise
  std::vector<std::string> notices;  // lines for stderr before the job starts (from Slurm)
};

// Parses the arguments after argv[0]. Throws UsageError (or NotImplementedError) on bad
// input. Does not look at the file system: see resolve_worker_command for the entrypoint.
CliResult parse_command_line(const std::vector<std::string>& args, const CliContext& context);

// --help, formatted for 80 columns.
std::string help_text();
// --version.
std::string version_text();
// --print_completion SHELL (bash, zsh or tcsh): a script completing ddprun's options.
std::string completion_script(const std::string& shell);

// Parses a --redirects/--tee value ("0".."3" or "0:1,1:2"); throws UsageError.
StdSpec parse_std_spec(const std::string& option, const std::string& value);

}  // namespace ddp::launcher
