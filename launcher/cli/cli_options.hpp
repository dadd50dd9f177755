#pragma once
// The table of ddprun's options: one row per torchrun option, shared by the parser (cli.cpp)
// and the help text (cli_help.cpp). Internal to the launcher library.

#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ddp::launcher::detail {

struct OptionSpec {
  std::string_view dest;  // torchrun's dest: the underscore spelling, PET_<DEST> in upper case
  std::string_view short_name;     // "-m", "-r", "-t" or empty
  bool dashed_spelling;            // also accepts --a-b for --a_b (every multi-word option)
  bool is_flag;                    // takes no value
  std::string_view metavar;        // for the help
  std::string_view default_value;  // torchrun's default as text (flags: empty)
  std::string_view group;          // help section
  std::string_view help;           // one sentence or two
  bool may_be_empty = false;       // "--opt=" is a valid (empty) value; else it is refused
};

std::span<const OptionSpec> option_table();

// "--nproc_per_node" for dest "nproc_per_node".
std::string long_name(const OptionSpec& spec);
// "--nproc-per-node" (same as long_name when the dest has no underscore).
std::string dashed_name(const OptionSpec& spec);
// "PET_NPROC_PER_NODE".
std::string env_name(const OptionSpec& spec);

// Option values as text after the command line and PET_ variables, before validation.
struct RawOptions {
  std::map<std::string, std::string> values;  // by dest: the value, or torchrun's default
  std::map<std::string, bool> flags;          // by dest
  std::map<std::string, std::string> origin;  // by dest: "--x" or "PET_X" when set by the user
  std::vector<std::string> command;           // the entrypoint and its arguments, untouched
  bool help = false;
  bool version = false;
};

// Runs CLI11 over the arguments after argv[0]: torchrun's options in both spellings, with
// argparse's rules (unambiguous prefixes, "--opt=" is an empty value, a value may not look
// like an option), PET_<OPTION> from the process environment as defaults. Everything from
// the entrypoint (the first non-option, or the argument after "--") on is `command`.
// Throws UsageError.
RawOptions parse_raw_options(const std::vector<std::string>& args);

}  // namespace ddp::launcher::detail
