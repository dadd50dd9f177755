// Warm workers the same as cold ones (issues 34 and 47): ordinary programs that ran differently in
// a worker forked from the warm template. Each case runs warm_cases.py under ddprun
// --warm_start=restart (2 workers, one restart): attempt 0 is exec'd, attempt 1 warm (or cold,
// with one line that names the reason), and what each rank saw in attempt 1 must be what it saw
// in attempt 0 (or what a cold attempt 1 sees). Against the PyTorch of DDP_TEST_PYTHON (both
// peers: [torch]).

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "process_harness.hpp"
#include "skip.hpp"
#include "test_support.hpp"

using namespace ddp::test;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const char* const kTorchMissing = " cannot import torch.distributed with Gloo";

struct CaseRun {
  ProcessResult result;
  fs::path out;
  json seen(int attempt, int rank) const {
    std::ifstream in(out / ("a" + std::to_string(attempt) + "_r" + std::to_string(rank) + ".json"));
    REQUIRE(in.good());
    return json::parse(in);
  }
};

// ddprun [options] warm_cases.py CASE OUT [args] in the scripts' folder (the script named by a
// relative path, as a user in their project's folder does), with the installed modules of a
// copy of warm_site on PYTHONPATH; `prefix` runs ddprun through another program (setpriv).
CaseRun run_case(const TempDir& dir, const std::string& name, std::vector<std::string> options,
                 std::map<std::string, std::string> env, std::vector<std::string> args = {},
                 const std::vector<std::string>& prefix = {}) {
  const fs::path out = dir.path() / "out";
  const fs::path site = dir.path() / "site-packages";
  fs::create_directories(out);
  fs::copy(source_path("tests/launcher/agent/python/warm_site/site-packages"), site,
           fs::copy_options::recursive);
  std::vector<std::string> argv = prefix;
  argv.insert(argv.end(), {"/bin/sh", "-c", "cd \"$0\" && exec \"$@\"",
                           source_path("tests/launcher/agent/python").string(),
                           bin_path("ddprun").string(), "--nproc_per_node=2",
                           "--warm_start=restart", "--log_dir=" + (dir.path() / "logs").string()});
  argv.insert(argv.end(), options.begin(), options.end());
  argv.insert(argv.end(), {"warm_cases.py", name, out.string()});
  argv.insert(argv.end(), args.begin(), args.end());
  env["PYTHON_EXEC"] = torch_python();
  env["PYTHONPATH"] = site.string();
  env["PYTHONUSERBASE"] = (dir.path() / "userbase").string();
  env["WARM_MARKER"] = (dir.path() / "marker").string();  // warm_job.py's own module counts
  return {run_process(argv, env, {}, milliseconds(240000)), out};
}

// Each rank saw in attempt 1 what it saw in attempt 0.
void check_same(const CaseRun& run) {
  for (int rank = 0; rank < 2; ++rank) {
    const json cold = run.seen(0, rank)["fields"];
    const json warm = run.seen(1, rank)["fields"];
    for (auto field = cold.begin(); field != cold.end(); ++field) {
      INFO("rank " << rank << ", field " << field.key());
      CHECK(warm.value(field.key(), json()).dump() == field.value().dump());
    }
  }
}

}  // namespace

TEST_CASE(
    "a warm worker runs as a cold one: the start-up's log, an absolute __file__, an exact long "
    "command line, fresh clocks and keys",
    "[torch]") {
  if (!torch_available()) return skip(torch_python() + kTorchMissing);
  TempDir dir;
  const fs::path log = dir.path() / "startup.log";
  const std::string long_argument(6000, 'x');  // more than the room a template had before
  const CaseRun run = run_case(dir, "plain", {"--max_restarts=1"},
                               {{"WARM_STARTUP_LOG", log.string()}}, {long_argument});
  INFO("stderr:\n" << run.result.err << "\nstdout:\n" << run.result.out);
  REQUIRE(run.result.status == 0);
  CHECK_THAT(run.result.err, Catch::Contains("warm start: attempt 1's 2 workers were forked"));
  check_same(run);
  for (int rank = 0; rank < 2; ++rank) {
    const json warm = run.seen(1, rank)["fields"];
    CHECK(fs::path(warm["file"].get<std::string>()).is_absolute());
    CHECK(warm["source_found"] == true);
    CHECK(warm["relative_created_ok"] == true);
  }
  // One authkey per process, as exec'd.
  CHECK(run.seen(1, 0)["authkey"] != run.seen(1, 1)["authkey"]);
  const std::string written = read_file(log);
  CHECK_THAT(written, Catch::Contains("attempt 1 rank 0") && Catch::Contains("attempt 1 rank 1"));
}

TEST_CASE(
    "without CAP_SYS_RESOURCE a warm worker's /proc/PID/cmdline is still exactly its own "
    "command line",
    "[torch]") {
  if (!torch_available()) return skip(torch_python() + kTorchMissing);
  if (!fs::exists("/usr/bin/setpriv")) return skip("no setpriv (util-linux) to drop a capability");
  TempDir dir;
  const CaseRun run =
      run_case(dir, "plain", {"--max_restarts=1"}, {}, {"an argument", "another"},
               {"/usr/bin/setpriv", "--inh-caps=-sys_resource", "--bounding-set=-sys_resource"});
  INFO("stderr:\n" << run.result.err << "\nstdout:\n" << run.result.out);
  REQUIRE(run.result.status == 0);
  CHECK_THAT(run.result.err, Catch::Contains("warm start: attempt 1's 2 workers were forked"));
  for (int rank = 0; rank < 2; ++rank) {
    INFO("rank " << rank);
    CHECK(run.seen(1, rank)["fields"]["cmdline_sha"] == run.seen(0, rank)["fields"]["cmdline_sha"]);
  }
}

TEST_CASE(
    "a program that sets a variable before import torch (on every rank, per rank, from the "
    "restart count) restarts cold, saying which, and its import sees it",
    "[torch]") {
  if (!torch_available()) return skip(torch_python() + kTorchMissing);
  const auto [name, why] = GENERATE(table<std::string, std::string>({
      {"same", "the program sets OMP_NUM_THREADS (to '2') before it imports torch"},
      // (Or "the program sets OMP_NUM_THREADS (to '2')" where rank 1's list came first.)
      {"per_rank_env", "the ranks imported torch after setting their environments differently"},
      {"restart_env",
       "the program sets TORCH_DISTRIBUTED_DEBUG (to 'OFF') before it imports "
       "torch"},
  }));
  TempDir dir;
  const CaseRun run = run_case(dir, name, {"--max_restarts=1"}, {});
  INFO("case " << name << "\nstderr:\n" << run.result.err << "\nstdout:\n" << run.result.out);
  REQUIRE(run.result.status == 0);
  const std::string cold = "attempt 1's workers start cold: ";
  if (name == "per_rank_env") {
    CHECK_THAT(run.result.err,
               Catch::Contains(cold + why) ||
                   Catch::Contains(cold + "the program sets OMP_NUM_THREADS (to '2') before it "
                                          "imports torch"));
  } else {
    CHECK_THAT(run.result.err, Catch::Contains(cold + why));
  }
  for (int rank = 0; rank < 2; ++rank) {
    INFO("rank " << rank);
    const json warm = run.seen(1, rank)["fields"];
    if (name == "same") {
      check_same(run);
      CHECK(warm["threads"] == 2);
      CHECK_THAT(warm["debug_level"].get<std::string>(), Catch::Contains("DETAIL"));
      CHECK(warm["jit_enabled"] == false);
    } else if (name == "per_rank_env") {
      CHECK(warm["threads"] == 1 + rank);
    } else {
      CHECK_THAT(warm["debug_level"].get<std::string>(), Catch::Contains("DETAIL"));
    }
  }
}

TEST_CASE(
    "what an installed module makes at import from its process is the forked worker's own "
    "(issue 47), the sitecustomize runs per worker, and the stack reaches as deep",
    "[torch]") {
  if (!torch_available()) return skip(torch_python() + kTorchMissing);
  TempDir dir;
  const CaseRun run = run_case(dir, "by_design", {"--max_restarts=1"}, {});
  INFO("stderr:\n" << run.result.err << "\nstdout:\n" << run.result.out);
  REQUIRE(run.result.status == 0);
  CHECK_THAT(run.result.err, Catch::Contains("warm start: attempt 1's 2 workers were forked"));
  check_same(run);
  for (int rank = 0; rank < 2; ++rank) {
    INFO("rank " << rank);
    const json warm = run.seen(1, rank)["fields"];
    CHECK(warm["startup_rank_is_own"] == true);
    CHECK(warm["pid_is_own"] == true);
    CHECK(warm["usr1_handled"] == true);
    CHECK(warm["shadow"] == "script folder");
    CHECK(warm["after_fork"].empty());
  }
  for (const std::string key : {"tmp", "session", "draw"}) {
    INFO(key);
    CHECK(run.seen(1, 0)["per_process"][key] != run.seen(1, 1)["per_process"][key]);
  }
}

TEST_CASE(
    "a site start-up that installs an import hook or sets a variable makes each forked worker "
    "exec itself cold, saying why, and the worker runs as exec'd",
    "[torch]") {
  if (!torch_available()) return skip(torch_python() + kTorchMissing);
  const auto [variable, why] = GENERATE(table<std::string, std::string>({
      {"WARM_SITE_HOOK", "installed an import hook (sitecustomize._Hook)"},
      {"WARM_SITE_THREADS", "sets OMP_NUM_THREADS, which torch's import may read"},
  }));
  TempDir dir;
  const CaseRun run = run_case(dir, "site_effects", {"--max_restarts=1"}, {{variable, "1"}});
  INFO(variable << "\nstderr:\n" << run.result.err << "\nstdout:\n" << run.result.out);
  REQUIRE(run.result.status == 0);
  CHECK_THAT(run.result.err, Catch::Contains("warm start: this worker starts cold: its site "
                                             "start-up (a .pth file or sitecustomize) " +
                                             why) ||
                                 Catch::Contains("warm start: this worker starts cold: its site "
                                                 "start-up " +
                                                 why));
  check_same(run);
  for (int rank = 0; rank < 2; ++rank) {
    if (variable == "WARM_SITE_THREADS") CHECK(run.seen(1, rank)["fields"]["threads"] == 1 + rank);
    if (variable == "WARM_SITE_HOOK") CHECK(run.seen(1, rank)["fields"]["hooked"] == true);
  }
}

TEST_CASE(
    "an installed module that reads RANK and the restart count at import sees the worker's own "
    "values in every forked attempt (the template never imports it)",
    "[torch]") {
  if (!torch_available()) return skip(torch_python() + kTorchMissing);
  TempDir dir;
  const CaseRun run = run_case(dir, "rank_again", {"--max_restarts=2"}, {});
  INFO("stderr:\n" << run.result.err << "\nstdout:\n" << run.result.out);
  REQUIRE(run.result.status == 0);
  CHECK_THAT(run.result.err, Catch::Contains("warm start: attempt 1's 2 workers were forked"));
  CHECK_THAT(run.result.err, Catch::Contains("warm start: attempt 2's 2 workers were forked"));
  for (int attempt = 1; attempt <= 2; ++attempt) {
    for (int rank = 0; rank < 2; ++rank) {
      INFO("attempt " << attempt << ", rank " << rank);
      CHECK(run.seen(attempt, rank)["fields"]["rank"] == rank);
      CHECK(run.seen(attempt, rank)["fields"]["restarts"] == std::to_string(attempt));
    }
  }
}

TEST_CASE(
    "an installed package's __init__.py edited between attempts runs its new code in a forked "
    "worker (the template never imported it)",
    "[torch]") {
  if (!torch_available()) return skip(torch_python() + kTorchMissing);
  TempDir dir;
  const CaseRun run = run_case(dir, "edit", {"--max_restarts=1"}, {});
  INFO("stderr:\n" << run.result.err << "\nstdout:\n" << run.result.out);
  REQUIRE(run.result.status == 0);
  CHECK_THAT(run.result.err, Catch::Contains("warm start: attempt 1's 2 workers were forked"));
  CHECK(run.seen(0, 0)["fields"]["value"] == 1);
  for (int rank = 0; rank < 2; ++rank) CHECK(run.seen(1, rank)["fields"]["value"] == 2);
}

TEST_CASE(
    "a package installed between attempts through a new .pth file is importable in the next "
    "attempt, forked (each worker runs its own site start-up)",
    "[torch]") {
  if (!torch_available()) return skip(torch_python() + kTorchMissing);
  TempDir dir;
  const CaseRun run = run_case(dir, "pth", {"--max_restarts=1"}, {});
  INFO("stderr:\n" << run.result.err << "\nstdout:\n" << run.result.out);
  REQUIRE(run.result.status == 0);
  CHECK_THAT(run.result.err, Catch::Contains("warm start: attempt 1's 2 workers were forked"));
  for (int rank = 0; rank < 2; ++rank) {
    CHECK(run.seen(1, rank)["fields"]["new_pkg"] == "installed between attempts");
  }
}

TEST_CASE(
    "a log the interpreter's start-up opens for writing (not appending) is each forked worker's "
    "own, as exec'd (the start-up runs in the worker)",
    "[torch]") {
  if (!torch_available()) return skip(torch_python() + kTorchMissing);
  TempDir dir;
  const CaseRun run = run_case(dir, "plain", {"--max_restarts=1"},
                               {{"WARM_STARTUP_LOG", (dir.path() / "startup.log").string()},
                                {"WARM_STARTUP_LOG_MODE", "w"}});
  INFO("stderr:\n" << run.result.err << "\nstdout:\n" << run.result.out);
  REQUIRE(run.result.status == 0);
  CHECK_THAT(run.result.err, Catch::Contains("warm start: attempt 1's 2 workers were forked"));
  check_same(run);
}

TEST_CASE(
    "with --warm_start=always, the first attempt of a program that sets its environment starts "
    "cold, saying so, and the environment takes effect",
    "[torch]") {
  if (!torch_available()) return skip(torch_python() + kTorchMissing);
  TempDir dir;
  const CaseRun run = run_case(dir, "env_always", {"--warm_start=always"}, {});
  INFO("stderr:\n" << run.result.err << "\nstdout:\n" << run.result.out);
  REQUIRE(run.result.status == 0);
  CHECK_THAT(run.result.err, Catch::Contains("attempt 0's workers start cold") &&
                                 Catch::Contains("sets an environment variable (line"));
  for (int rank = 0; rank < 2; ++rank) {
    const json seen = run.seen(0, rank)["fields"];
    CHECK(seen["threads"] == 2);
    CHECK_THAT(seen["debug_level"].get<std::string>(), Catch::Contains("DETAIL"));
    CHECK(seen["jit_enabled"] == false);
  }
}
