// --help and docs/cli.md against the code: every option the parser takes is in both, every
// option docs/cli.md names is one ddprun takes, the exit statuses both list are the ones
// ddprun returns, and the restart line and failure report docs/cli.md shows are what ddprun
// prints (run for real, with build/bin/ddprun and ddp-sample-worker).
#include <algorithm>
#include <catch2/catch.hpp>
#include <csignal>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "cli/cli_options.hpp"
#include "ddp/common/worker_contract.hpp"
#include "ddp/launcher/cli.hpp"
#include "process_harness.hpp"
#include "skip.hpp"
#include "test_support.hpp"

using namespace ddp::launcher;
using namespace ddp::test;

namespace {

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path);
  INFO("reading " << path);
  REQUIRE(in.good());
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string cli_md() { return read_text(source_path("docs/cli.md")); }

// The text of a Markdown section: from its "## title" line to the next "## ".
std::string section(const std::string& markdown, const std::string& title) {
  const auto start = markdown.find("\n## " + title + "\n");
  REQUIRE(start != std::string::npos);
  const auto end = markdown.find("\n## ", start + 1);
  return markdown.substr(start, end == std::string::npos ? std::string::npos : end - start);
}

// The names a user may type: --help, --version and both spellings of every option.
std::set<std::string> accepted_names() {
  std::set<std::string> names = {"--help", "--version"};
  for (const detail::OptionSpec& spec : detail::option_table()) {
    names.insert(detail::long_name(spec));
    if (spec.dashed_spelling) names.insert(detail::dashed_name(spec));
  }
  return names;
}

std::vector<std::string> ddprun_argv(const std::vector<std::string>& options,
                                     const std::vector<std::string>& worker_args) {
  std::vector<std::string> argv = {bin_path("ddprun").string()};
  argv.insert(argv.end(), options.begin(), options.end());
  argv.push_back(bin_path("ddp-sample-worker").string());
  argv.insert(argv.end(), worker_args.begin(), worker_args.end());
  return argv;
}

}  // namespace

TEST_CASE("every option the parser takes is in --help and in docs/cli.md") {
  const std::string help = help_text();
  const std::string doc = cli_md();
  for (const detail::OptionSpec& spec : detail::option_table()) {
    const std::string name = detail::long_name(spec);
    INFO(name);
    CHECK_THAT(help, Catch::Contains("  " + name + " ") || Catch::Contains(", " + name + " ") ||
                         Catch::Contains("  " + name + "\n"));
    if (!spec.short_name.empty()) CHECK_THAT(help, Catch::Contains(std::string(spec.short_name)));
    CHECK_THAT(doc,
               Catch::Contains("`" + name) || Catch::Contains("`" + detail::dashed_name(spec)));
  }
}

TEST_CASE("every option docs/cli.md names is one ddprun takes") {
  const std::set<std::string> accepted = accepted_names();
  // Named in docs/cli.md without being options of ddprun, each for a reason.
  const std::set<std::string> not_options = {
      "--opt",         // the placeholder of "--opt=value"
      "--local_rank",  // the worker's argument that --legacy_local_rank adds
  };
  const std::string doc = cli_md();
  // Not inside a link's anchor ("#the-timeline---trace_filepath") or a longer word.
  const std::regex option_name("(^|[^#\\w-])(--[a-zA-Z][a-zA-Z_-]*)");
  std::set<std::string> seen;
  for (auto it = std::sregex_iterator(doc.begin(), doc.end(), option_name);
       it != std::sregex_iterator(); ++it) {
    seen.insert((*it)[2].str());
  }
  REQUIRE(seen.size() > 20);
  for (const std::string& name : seen) {
    if (accepted.contains(name) || not_options.contains(name)) continue;
    // The doc shows argparse's prefixes (--nproc, --stand, an ambiguous --n): a prefix of a
    // name ddprun takes.
    bool prefix = false;
    for (const std::string& full : accepted) prefix |= full.starts_with(name);
    INFO(name << " is named in docs/cli.md but ddprun takes no such option");
    CHECK(prefix);
  }
}

TEST_CASE("the help lists each group of options once") {
  const std::string help = help_text();
  std::set<std::string_view> groups;
  for (const detail::OptionSpec& spec : detail::option_table()) groups.insert(spec.group);
  for (std::string_view group : groups) {
    const std::string header = "\n" + std::string(group) + ":\n";
    INFO(header);
    const auto first = help.find(header);
    CHECK(first != std::string::npos);
    CHECK(help.find(header, first + 1) == std::string::npos);
  }
}

TEST_CASE("the exit statuses --help and docs/cli.md list are the ones ddprun returns") {
  std::string help = help_text();
  help = help.substr(help.find("Exit status:"));
  std::replace(help.begin(), help.end(), '\n', ' ');
  const std::string table = section(cli_md(), "Exit status");
  TempDir dir;
  const auto not_a_program = dir.path() / "not-a-program";
  std::ofstream(not_a_program) << "\x7f"
                               << "ELF but not a program";
  std::filesystem::permissions(not_a_program, std::filesystem::perms::owner_all);

  struct Case {
    int status;
    std::string help_says;  // in the help's "Exit status:" paragraph
    std::string doc_row;    // the first cell of the row in docs/cli.md
    std::vector<std::string> argv;
  };
  const std::vector<std::string> torchrun = {"--exit_code=torchrun"};
  const std::vector<std::string> root_cause = {"--exit_code=root_cause"};
  const std::vector<Case> cases = {
      {0, "0 when every worker succeeded", "| 0 |", ddprun_argv(torchrun, {"--exit", "0"})},
      {1, "1 for any failure (a worker failed and no restart was left",
       "| 1 | anything else: a worker failed and no restarts were left",
       ddprun_argv({"--exit_code=torchrun", "--nproc_per_node=2"},
                   {"--if-rank", "1", "--exit", "3", "--wait"})},
      {1,
       "a worker could not be started",
       "a worker could not be started",
       {bin_path("ddprun").string(), "--exit_code=torchrun", "--no_python",
        not_a_program.string()}},
      {1, "a bad option value", "`--nproc_per_node=abc`",
       ddprun_argv({"--exit_code=torchrun", "--nproc_per_node=abc"}, {})},
      {2, "2 for a command line that does not parse", "| 2 |",
       ddprun_argv({"--no-such-option"}, {})},
      {3, "the root cause's exit code", "| the root cause's exit code",
       ddprun_argv({"--exit_code=root_cause", "--nproc_per_node=2"},
                   {"--if-rank", "1", "--exit", "3", "--wait"})},
      {128 + SIGKILL, "(128+N when it died by signal N)", "or 128+N after signal N",
       ddprun_argv(root_cause, {"--signal", "SIGKILL"})},
  };
  for (const Case& c : cases) {
    ProcessResult r = run_process(c.argv);
    INFO("expected " << c.status << "\n" << r.err);
    CHECK(r.status == c.status);
    CHECK_THAT(help, Catch::Contains(c.help_says));
    CHECK_THAT(table, Catch::Contains(c.doc_row));
  }
  // ddprun's own signal (tested in launcher_signal_grace_test and launcher_agent_test).
  CHECK_THAT(help, Catch::Contains("128+N when ddprun itself got signal N"));
  CHECK_THAT(table, Catch::Contains("| 128+N | ddprun got signal N"));
}

TEST_CASE("every variable ddprun gives a worker is in docs/cli.md's tables") {
  const std::string doc = section(cli_md(), "Worker environment");
  for (const char* name : ddp::contract::kWorkerVariables) {
    INFO(name);
    CHECK_THAT(doc, Catch::Contains(std::string("`") + name + "`"));
  }
  const auto own = doc.find("\n### Variables only ddprun sets\n");
  REQUIRE(own != std::string::npos);
  for (const char* name :
       {ddp::contract::kRecordFd, ddp::contract::kStackFd, ddp::contract::kStackSignal,
        ddp::contract::kModulesFile, ddp::contract::kUserPythonPath,
        ddp::contract::kFlightRecorderOldNames}) {
    INFO(name);
    CHECK_THAT(doc.substr(own), Catch::Contains(std::string("`") + name + "`"));
  }
}

TEST_CASE("the restart line and the failure report in docs/cli.md are what ddprun prints") {
  const std::string doc = section(cli_md(), "Failures, restarts and signals");
  // As the doc's: rank 1 fails with exit code 3 and an error file, restarts remain.
  ProcessResult r = run_process(ddprun_argv({"--nproc_per_node=2", "--max_restarts=3"},
                                            {"--if-rank", "1", "--error-file", "CUDA out of memory",
                                             "--if-rank", "1", "--exit", "3", "--wait"}));
  INFO(r.err);
  REQUIRE(r.status == 3);
  std::smatch host;
  REQUIRE(std::regex_search(r.err, host, std::regex("\n  host      : (\\S+)\n")));

  // The doc's line, with its host ("vm") replaced by this one's.
  std::smatch shown;
  REQUIRE(std::regex_search(doc, shown, std::regex("`(ddprun: worker group failed [^`]*)`")));
  std::string line = shown[1].str();
  REQUIRE(line.find(" on vm:") != std::string::npos);
  line.replace(line.find(" on vm:"), 7, " on " + host[1].str() + ":");
  CHECK_THAT(r.err, Catch::Contains(line + "\n"));

  // The report's lines without a value of this run (rules, headings, field names), in order.
  const auto block = doc.find("```\n=====");
  REQUIRE(block != std::string::npos);
  std::istringstream shown_report(doc.substr(block + 4, doc.find("```", block + 4) - block - 4));
  std::size_t at = r.err.find("=====");
  REQUIRE(at != std::string::npos);
  for (std::string expected; std::getline(shown_report, expected);) {
    if (expected.find(" FAILED") != std::string::npos) expected = " FAILED";
    if (expected.starts_with("=====") || expected.starts_with("-----")) {
      expected = expected.substr(0, 10);  // the rules are as wide as the report
    }
    std::smatch field;  // "  rank      : 1 (local_rank: 1)" -> "  rank      : "
    if (std::regex_search(expected, field, std::regex("^  [a-z_]+ *: "))) expected = field.str();
    if (expected.starts_with("    ") || expected.starts_with("  traceback")) continue;
    INFO("the doc's report line '" << expected << "', in order");
    at = r.err.find(expected, at);
    REQUIRE(at != std::string::npos);
  }
}

TEST_CASE("ddp-sample-worker, used in the docs' examples, has a --help") {
  ProcessResult r = run_process({bin_path("ddp-sample-worker").string(), "--help"});
  CHECK(r.status == 0);
  CHECK_THAT(r.out, Catch::Contains("--if-rank R"));
  CHECK_THAT(r.out, Catch::Contains("--exit CODE"));
}

TEST_CASE("the restart line in docs/quickstart.md is what ddprun prints") {
  const std::string doc = read_text(source_path("docs/quickstart.md"));
  std::smatch shown;
  REQUIRE(std::regex_search(doc, shown, std::regex("`(worker group failed [^`]*)`")));
  // As in the quickstart: rank 1 killed by SIGKILL, one restart allowed.
  ProcessResult r = run_process(ddprun_argv({"--nproc_per_node=2", "--max_restarts=1"},
                                            {"--if-rank", "1", "--signal", "SIGKILL", "--wait"}));
  INFO(r.err);
  CHECK(r.status == 128 + SIGKILL);
  std::smatch host;
  REQUIRE(std::regex_search(r.err, host, std::regex("\n  host      : (\\S+)\n")));
  std::string line = shown[1].str();
  REQUIRE(line.find(" on vm:") != std::string::npos);
  line.replace(line.find(" on vm:"), 7, " on " + host[1].str() + ":");
  CHECK_THAT(r.err, Catch::Contains("ddprun: " + line + "\n"));
}

TEST_CASE("every option of the PyTorch's torchrun is one ddprun takes and docs/cli.md names",
          "[torch]") {
  if (!torch_available()) return skip(torch_python() + " cannot import torch");
  // torchrun's own parser lists its option strings, both spellings.
  ProcessResult r = run_process({torch_python(), "-c",
                                 "from torch.distributed.run import get_args_parser\n"
                                 "for action in get_args_parser()._actions:\n"
                                 "    for name in action.option_strings: print(name)\n"});
  INFO(r.err);
  REQUIRE(r.status == 0);
  const std::set<std::string> accepted = accepted_names();
  const std::string doc = cli_md();
  std::istringstream names(r.out);
  int seen = 0;
  for (std::string name; std::getline(names, name);) {
    if (!name.starts_with("--")) continue;  // -h, -m, -r, -t: checked with their long names
    ++seen;
    INFO("torchrun's " << name);
    CHECK(accepted.contains(name));
    std::string underscored = name;
    std::replace(underscored.begin() + 2, underscored.end(), '-', '_');
    std::string dashed = name;
    std::replace(dashed.begin() + 2, dashed.end(), '_', '-');
    CHECK((doc.find("`" + underscored) != std::string::npos ||
           doc.find("`" + dashed) != std::string::npos));
  }
  CHECK(seen > 20);
}
