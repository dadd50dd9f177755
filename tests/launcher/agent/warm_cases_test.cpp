// Warm workers the same as cold ones (issue 34): ordinary programs that ran differently in a
// worker forked from the warm template. Each case runs warm_cases.py under ddprun (2 workers, one
// restart): attempt 0 is exec'd, attempt 1 warm (or cold, with one line that names the reason),
// and what each rank saw in attempt 1 must be what it saw in attempt 0 (or what a cold attempt 1
// sees). Against the PyTorch of DDP_TEST_PYTHON (both peers: [torch]).

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
  argv.insert(argv.end(),
              {"/bin/sh", "-c", "cd \"$0\" && exec \"$@\"",
               source_path("tests/launcher/agent/python").string(), bin_path("ddprun").string(),
               "--nproc_per_node=2", "--log_dir=" + (dir.path() / "logs").string()});
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
    "a warm worker runs as a cold one: the environment set before import torch, the start-up's "
    "log, an absolute __file__, an exact long command line, fresh clocks and keys",
    "[torch]") {
  if (!torch_available()) return skip(torch_python() + kTorchMissing);
  TempDir dir;
  const fs::path log = dir.path() / "startup.log";
  const std::string long_argument(6000, 'x');  // more than the room a template had before
  const CaseRun run = run_case(dir, "same", {"--max_restarts=1"},
                               {{"WARM_STARTUP_LOG", log.string()}}, {long_argument});
  INFO("stderr:\n" << run.result.err << "\nstdout:\n" << run.result.out);
  REQUIRE(run.result.status == 0);
  CHECK_THAT(run.result.err, Catch::Contains("warm start: attempt 1's 2 workers were forked"));
  check_same(run);
  for (int rank = 0; rank < 2; ++rank) {
    const json warm = run.seen(1, rank)["fields"];
    CHECK(warm["threads"] == 2);
    CHECK_THAT(warm["debug_level"].get<std::string>(), Catch::Contains("DETAIL"));
    CHECK(warm["jit_enabled"] == false);
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
      run_case(dir, "same", {"--max_restarts=1"}, {}, {"an argument", "another"},
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
    "an installed module that reads RANK and the restart count at import sees the worker's own "
    "values, the line that says so names it, and the next template stops before it (the restart "
    "after is warm)",
    "[torch]") {
  if (!torch_available()) return skip(torch_python() + kTorchMissing);
  TempDir dir;
  const CaseRun run = run_case(dir, "rank_again", {"--max_restarts=2"}, {});
  INFO("stderr:\n" << run.result.err << "\nstdout:\n" << run.result.out);
  REQUIRE(run.result.status == 0);
  CHECK_THAT(run.result.err, Catch::Contains("warm_rank_reader reads RANK at import"));
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
    "an installed package's __init__.py edited between attempts runs its new code (the attempt "
    "starts cold, saying which file changed)",
    "[torch]") {
  if (!torch_available()) return skip(torch_python() + kTorchMissing);
  TempDir dir;
  const CaseRun run = run_case(dir, "edit", {"--max_restarts=1"}, {});
  INFO("stderr:\n" << run.result.err << "\nstdout:\n" << run.result.out);
  REQUIRE(run.result.status == 0);
  CHECK_THAT(run.result.err, Catch::Contains("warm_pkg (") &&
                                 Catch::Contains("changed since the template imported it"));
  CHECK(run.seen(0, 0)["fields"]["value"] == 1);
  for (int rank = 0; rank < 2; ++rank) CHECK(run.seen(1, rank)["fields"]["value"] == 2);
}

TEST_CASE(
    "a package installed between attempts through a new .pth file is importable in the next "
    "attempt (it starts cold, saying why)",
    "[torch]") {
  if (!torch_available()) return skip(torch_python() + kTorchMissing);
  TempDir dir;
  const CaseRun run = run_case(dir, "pth", {"--max_restarts=1"}, {});
  INFO("stderr:\n" << run.result.err << "\nstdout:\n" << run.result.out);
  REQUIRE(run.result.status == 0);
  CHECK_THAT(run.result.err, Catch::Contains("warm_new.pth was added"));
  for (int rank = 0; rank < 2; ++rank) {
    CHECK(run.seen(1, rank)["fields"]["new_pkg"] == "installed between attempts");
  }
}

TEST_CASE(
    "a log the interpreter's start-up opened for writing (not appending) makes the attempt "
    "cold, saying so, and the job runs as cold",
    "[torch]") {
  if (!torch_available()) return skip(torch_python() + kTorchMissing);
  TempDir dir;
  const CaseRun run = run_case(dir, "same", {"--max_restarts=1"},
                               {{"WARM_STARTUP_LOG", (dir.path() / "startup.log").string()},
                                {"WARM_STARTUP_LOG_MODE", "w"}});
  INFO("stderr:\n" << run.result.err << "\nstdout:\n" << run.result.out);
  REQUIRE(run.result.status == 0);
  CHECK_THAT(run.result.err, Catch::Contains("attempt 1's workers start cold") &&
                                 Catch::Contains("the interpreter's start-up opened descriptor"));
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
