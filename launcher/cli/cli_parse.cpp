// The command line's first pass: argparse's spelling rules, then CLI11 over the launcher's
// options (see parse_raw_options in cli_options.hpp).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <set>

#include "cli/cli_options.hpp"
#include "ddp/launcher/cli.hpp"

namespace ddp::launcher::detail {
namespace {

// The options CLI11 knows besides the table's.
constexpr std::string_view kHelp = "--help";
constexpr std::string_view kVersion = "--version";

struct LongName {
  std::string name;       // "--nproc-per-node"
  std::string canonical;  // "--nproc_per_node": what a prefix of `name` expands to
  bool takes_value;
};

std::vector<LongName> long_names() {
  std::vector<LongName> names = {{std::string(kHelp), std::string(kHelp), false},
                                 {std::string(kVersion), std::string(kVersion), false}};
  for (const OptionSpec& spec : option_table()) {
    names.push_back({long_name(spec), long_name(spec), !spec.is_flag});
    if (spec.dashed_spelling) names.push_back({dashed_name(spec), long_name(spec), !spec.is_flag});
  }
  return names;
}

// The long option that `name` (no "=value") spells, exactly or as argparse's unambiguous
// prefix; nullptr when it names none (CLI11 then reports it unknown). Throws UsageError
// naming the candidates when the prefix is ambiguous.
const LongName* resolve_long(const std::vector<LongName>& names, const std::string& name) {
  for (const LongName& n : names) {
    if (n.name == name) return &n;
  }
  const LongName* match = nullptr;
  std::set<std::string> candidates;
  for (const LongName& n : names) {
    if (n.name.starts_with(name)) {
      match = &n;
      candidates.insert(n.canonical);
    }
  }
  if (candidates.size() > 1) {
    std::string list;
    for (const std::string& c : candidates) list += (list.empty() ? "" : ", ") + c;
    throw CommandLineError("ambiguous option: " + name + " could match " + list);
  }
  return match;
}

const OptionSpec* short_option(const std::string& arg) {
  for (const OptionSpec& spec : option_table()) {
    if (!spec.short_name.empty() && arg.starts_with(spec.short_name)) return &spec;
  }
  return nullptr;
}

// argparse reads "-1" as a value, "-x" or "--x" as an option.
bool looks_like_option(const std::string& arg) {
  return arg.size() > 1 && arg[0] == '-' && !(arg[1] >= '0' && arg[1] <= '9');
}

// The value of the option at args[i] when it is given as the next argument: checks it is
// there and does not look like an option (argparse: "expected one argument").
void check_separate_value(const std::vector<std::string>& args, std::size_t i,
                          const std::string& name) {
  if (i + 1 >= args.size() || looks_like_option(args[i + 1]) || args[i + 1] == "--") {
    throw CommandLineError(name + ": expected a value (give " + name + "=VALUE, or " + name +
                           "= for an empty one)");
  }
}

struct Normalized {
  std::vector<std::string> args;
  std::size_t command_start = 0;  // index in args of the entrypoint, or of the "--" before it
  bool separator = false;         // args[command_start] is that "--"
};

// Rewrites the launcher's part of the arguments into spellings CLI11 reads as argparse
// would: prefixes expanded, "--opt=" and "-r=" as the option and an empty (or the given)
// value as the next argument. Stops at the first non-option or "--"; the rest is untouched.
Normalized normalize(const std::vector<std::string>& args) {
  const std::vector<LongName> names = long_names();
  Normalized normalized;
  std::vector<std::string>& out = normalized.args;
  std::size_t i = 0;
  for (; i < args.size() && looks_like_option(args[i]) && args[i] != "--"; ++i) {
    const std::string& arg = args[i];
    if (arg.starts_with("--")) {
      std::size_t eq = arg.find('=');
      const LongName* option = resolve_long(names, arg.substr(0, eq));
      if (!option) {
        out.push_back(arg);  // unknown: CLI11 reports it
        continue;
      }
      out.push_back(option->canonical);
      if (eq != std::string::npos) {
        out.push_back(arg.substr(eq + 1));
      } else if (option->takes_value) {
        check_separate_value(args, i, option->canonical);
        out.push_back(args[++i]);
      }
      continue;
    }
    const OptionSpec* spec = short_option(arg);
    if (!spec || spec->is_flag) {
      out.push_back(arg);
      continue;
    }
    out.push_back(std::string(spec->short_name));
    if (arg.size() > 2) {  // -r3 or -r=3
      out.push_back(arg.substr(arg[2] == '=' ? 3 : 2));
    } else {
      check_separate_value(args, i, std::string(spec->short_name));
      out.push_back(args[++i]);
    }
  }
  normalized.command_start = out.size();
  normalized.separator = i < args.size() && args[i] == "--";
  out.insert(out.end(), args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
  return normalized;
}

std::string cli11_names(const OptionSpec& spec) {
  std::string names = long_name(spec);
  if (spec.dashed_spelling) names += "," + dashed_name(spec);
  if (!spec.short_name.empty()) names = std::string(spec.short_name) + "," + names;
  return names;
}

// The worker command: what CLI11 left (prefix_command() stops at the first positional).
// Before the entrypoint it also leaves the options it does not know: those are errors.
// It keeps a "--": the one before the entrypoint is dropped here.
std::vector<std::string> worker_command(const Normalized& normalized,
                                        std::vector<std::string> remaining) {
  std::size_t command_size = normalized.args.size() - normalized.command_start;
  if (remaining.size() > command_size) {
    throw CommandLineError("unknown option " + remaining.front() + " (see ddprun --help)");
  }
  if (normalized.separator && !remaining.empty()) remaining.erase(remaining.begin());
  return remaining;
}

// Records where each option the user set came from: the command line or PET_<OPTION>.
void record_values(const CLI::App& app, const std::map<std::string, CLI::Option*>& added,
                   RawOptions& raw) {
  const std::vector<CLI::Option*> parsed = app.parse_order();
  for (const OptionSpec& spec : option_table()) {
    std::string dest(spec.dest);
    const CLI::Option* option = added.at(dest);
    if (option->count() == 0) continue;
    bool from_command_line = std::find(parsed.begin(), parsed.end(), option) != parsed.end();
    std::string value = option->results().back();
    raw.origin[dest] = from_command_line ? long_name(spec) : env_name(spec);
    if (!spec.is_flag) {
      raw.values[dest] = value;
    } else if (from_command_line) {
      raw.flags[dest] = true;
    } else {  // torchrun: bool(int(value))
      char* end = nullptr;
      long number = std::strtol(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0') {
        throw UsageError(env_name(spec) + "=" + value + ": expected 0 or 1");
      }
      raw.flags[dest] = number != 0;
    }
  }
}

void refuse_empty_values(const RawOptions& raw) {
  for (const OptionSpec& spec : option_table()) {
    std::string dest(spec.dest);
    if (spec.is_flag || spec.may_be_empty || !raw.origin.contains(dest)) continue;
    if (raw.values.at(dest).empty()) {
      throw UsageError(raw.origin.at(dest) + "=: " + long_name(spec) +
                       " cannot be empty (see ddprun --help)");
    }
  }
}

}  // namespace

RawOptions parse_raw_options(const std::vector<std::string>& args) {
  RawOptions raw;
  CLI::App app("ddprun", "ddprun");
  app.set_help_flag();
  app.prefix_command();
  app.add_flag(std::string(kHelp) + ",-h", raw.help);
  app.add_flag(std::string(kVersion), raw.version);
  std::map<std::string, CLI::Option*> added;
  for (const OptionSpec& spec : option_table()) {
    std::string dest(spec.dest);
    raw.flags[dest] = false;
    if (!spec.is_flag) raw.values[dest] = std::string(spec.default_value);
    CLI::Option* option =
        spec.is_flag ? app.add_flag(cli11_names(spec)) : app.add_option(cli11_names(spec));
    option->envname(env_name(spec))->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    if (!spec.is_flag) option->allow_extra_args(false);
    added[dest] = option;
  }
  Normalized normalized = normalize(args);
  std::vector<std::string> reversed(normalized.args.rbegin(),
                                    normalized.args.rend());  // CLI11 pops
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    throw CommandLineError(e.what());
  }
  raw.command = worker_command(normalized, app.remaining());
  record_values(app, added, raw);
  refuse_empty_values(raw);
  return raw;
}

}  // namespace ddp::launcher::detail
