// --help and --version texts, rendered from the option table for 80 columns.
#include <sstream>

#include "cli/cli_options.hpp"
#include "ddp/launcher/cli.hpp"

#ifndef DDP_VERSION
#define DDP_VERSION "0.0.0"
#endif

namespace ddp::launcher {
namespace {

constexpr std::size_t kWidth = 80;
constexpr std::size_t kHelpColumn = 28;

// Appends text word-wrapped to kWidth. The first line continues at `column`; the others are
// indented by `indent`.
void wrap(std::ostringstream& out, std::size_t column, const std::string& text,
          std::size_t indent = kHelpColumn) {
  std::istringstream words(text);
  std::string word;
  std::size_t at = column;
  bool first = true;
  while (words >> word) {
    if (!first && at + 1 + word.size() > kWidth) {
      out << '\n' << std::string(indent, ' ');
      at = indent;
      first = true;
    }
    if (!first) {
      out << ' ';
      ++at;
    }
    out << word;
    at += word.size();
    first = false;
  }
  out << '\n';
}

std::string option_label(const detail::OptionSpec& spec) {
  std::string label = "  ";
  if (!spec.short_name.empty()) {
    label += spec.short_name;
    label += ", ";
  }
  label += detail::long_name(spec);
  if (!spec.is_flag) {
    label += ' ';
    label += spec.metavar;
  }
  return label;
}

}  // namespace

std::string help_text() {
  std::ostringstream out;
  out << "usage: ddprun [options] ENTRYPOINT [ARGS...]\n\n";
  wrap(out, 0,
       "Starts --nproc_per_node workers on this node exactly as torchrun would: each gets "
       "RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and the rest of torchrun's environment. "
       "ENTRYPOINT is a Python script (a .py file, an executable whose #! names Python, or a "
       "non-executable text file: run with $PYTHON_EXEC or python3 -u), a module (-m) or a "
       "program (run directly); everything after it goes to the workers untouched.",
       0);
  out << '\n';
  wrap(out, 0,
       "Every option with an underscore also has a dashed spelling (--nproc-per-node), and "
       "PET_<OPTION> in the environment sets its default (PET_NPROC_PER_NODE=4).",
       0);
  std::string_view group;
  for (const detail::OptionSpec& spec : detail::option_table()) {
    if (spec.group != group) {
      group = spec.group;
      out << '\n' << group << ":\n";
    }
    std::string label = option_label(spec);
    std::string help(spec.help);
    if (!spec.default_value.empty()) help += " [" + std::string(spec.default_value) + "]";
    if (label.size() + 2 > kHelpColumn) {
      out << label << '\n' << std::string(kHelpColumn, ' ');
    } else {
      out << label << std::string(kHelpColumn - label.size(), ' ');
    }
    wrap(out, kHelpColumn, help);
  }
  out << "\nOther:\n";
  out << "  -h, --help                Show this help and exit.\n";
  out << "  --version                 Show the version and exit.\n";
  out << '\n';
  wrap(out, 0,
       "Exit status: as torchrun's, 0 when every worker succeeded; 1 for any failure (a "
       "worker failed and no restart was left, ddprun got a signal, a worker could not be "
       "started, the job hung, the rendezvous failed, a bad option value); 2 for a command "
       "line that does not parse. With --exit_code=root_cause: the root cause's exit code "
       "(128+N when it died by signal N), and 128+N when ddprun itself got signal N.",
       0);
  return out.str();
}

std::string completion_script(const std::string& shell) {
  std::string words = "--help --version";
  for (const detail::OptionSpec& spec : detail::option_table()) {
    words += " " + detail::long_name(spec);
    if (spec.dashed_spelling) words += " " + detail::dashed_name(spec);
    if (!spec.short_name.empty()) words += " " + std::string(spec.short_name);
  }
  if (shell == "tcsh") {  // tcsh's words come without the leading "--"
    std::string bare;
    std::istringstream in(words);
    for (std::string word; in >> word;) {
      if (word.starts_with("--")) bare += (bare.empty() ? "" : " ") + word.substr(2);
    }
    return "# tcsh completion for ddprun: eval `ddprun --print_completion tcsh`\n"
           "complete ddprun 'c/--/(" +
           bare + ")/' 'p/*/f/'\n";
  }
  std::string script = "# " + shell +
                       " completion for ddprun: eval \"$(ddprun --print_completion " + shell +
                       ")\"\n";
  if (shell == "zsh") script += "autoload -U +X bashcompinit && bashcompinit\n";
  script +=
      "_ddprun() {\n"
      "  local cur=${COMP_WORDS[COMP_CWORD]}\n"
      "  if [[ $cur == -* ]]; then\n"
      "    COMPREPLY=($(compgen -W \"" +
      words +
      "\" -- \"$cur\"))\n"
      "  else\n"
      "    COMPREPLY=()\n"
      "  fi\n"
      "}\n"
      "complete -o default -F _ddprun ddprun\n";
  return script;
}

std::string version_text() { return "ddprun " DDP_VERSION " (torchrun-compatible launcher)\n"; }

}  // namespace ddp::launcher
