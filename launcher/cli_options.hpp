#pragma once
// The table of ddprun's options: one row per torchrun option, shared by the parser (cli.cpp)
// and the help text (cli_help.cpp). Internal to the launcher library.

#include <span>
#include <string>
#include <string_view>

namespace ddp::launcher::detail {

struct OptionSpec {
  std::string_view dest;      // torchrun's dest: the underscore spelling, PET_<DEST> in upper case
  std::string_view short_name;  // "-m", "-r", "-t" or empty
  bool dashed_spelling;       // also accepts --a-b for --a_b (every multi-word option)
  bool is_flag;               // takes no value
  std::string_view metavar;   // for the help
  std::string_view default_value;  // torchrun's default as text (flags: empty)
  std::string_view group;     // help section
  std::string_view help;      // one sentence or two
};

std::span<const OptionSpec> option_table();

// "--nproc_per_node" for dest "nproc_per_node".
std::string long_name(const OptionSpec& spec);
// "--nproc-per-node" (same as long_name when the dest has no underscore).
std::string dashed_name(const OptionSpec& spec);
// "PET_NPROC_PER_NODE".
std::string env_name(const OptionSpec& spec);

}  // namespace ddp::launcher::detail
