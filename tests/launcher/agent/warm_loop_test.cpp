// The agent's loop never waits for the warm template (issue 35): while a restart waits for a
// template that imports slowly or never answers, a signal is acted on at once and teed output
// flows; a template that never answers ends in a cold start after the bounded wait. Plain
// Python (warm_wait.py imports no PyTorch): these run wherever a python3 is.

#include <catch2/catch.hpp>
#include <csignal>
#include <filesystem>
#include <fstream>

#include "process_harness.hpp"
#include "skip.hpp"
#include "test_support.hpp"

using namespace ddp::test;
namespace fs = std::filesystem;

namespace {

// ddprun running warm_wait.py, 2 workers teed, with warm_slow's site folder in out.
struct SlowTemplateJob {
  TempDir out;
  TempDir logs;
  std::unique_ptr<ChildProcess> ddprun;

  SlowTemplateJob() {
    fs::copy(source_path("tests/launcher/agent/python/warm_slow_site/site-packages"),
             out.path() / "site-packages", fs::copy_options::recursive);
    ddprun = std::make_unique<ChildProcess>(
        std::vector<std::string>{
            bin_path("ddprun").string(), "--nproc_per_node=2", "--max_restarts=1",
            "--warm_start=restart", "--warm_preload=warm_slow", "--tee=3",
            "--log_dir=" + logs.path().string(),
            source_path("tests/launcher/agent/python/warm_wait.py").string(), out.path().string()},
        std::map<std::string, std::string>{
            {"PYTHON_EXEC", torch_python()},
            {"PYTHONPATH", (out.path() / "site-packages").string()}});
  }
};

}  // namespace

TEST_CASE("SIGTERM while a restart waits for the warm template: acted on at once, output flows") {
  if (!fs::exists(torch_python())) return skip(torch_python() + " does not exist");
  SlowTemplateJob job;
  // The restart waits for the template's import (it never ends): the loop still tees output.
  job.ddprun->wait_for_stdout_lines("tick while the template imports", 1, milliseconds(60000));
  CHECK(fs::exists(job.out.path() / "importing"));
  job.ddprun->signal(SIGTERM);
  const ProcessResult result = job.ddprun->wait(milliseconds(60000));
  INFO("stderr:\n" << result.err << "\nstdout:\n" << result.out);
  CHECK(result.status == 128 + SIGTERM);
  CHECK_THAT(result.err, Catch::Contains("ddprun: got SIGTERM"));
  // Acted on during the wait, not after it: the wait never ran out, no worker was started.
  CHECK_THAT(result.err, !Catch::Contains("still importing"));
  CHECK_THAT(result.out, !Catch::Contains("attempt 1 rank"));
  CHECK_FALSE(fs::exists(job.out.path() / "go"));
}

TEST_CASE("a warm template that never answers: the restart starts cold after the bounded wait") {
  if (!fs::exists(torch_python())) return skip(torch_python() + " does not exist");
  SlowTemplateJob job;
  job.ddprun->wait_for_stdout_lines("tick while the template imports", 1, milliseconds(60000));
  const ProcessResult result = job.ddprun->wait(milliseconds(120000));
  INFO("stderr:\n" << result.err << "\nstdout:\n" << result.out);
  CHECK(result.status == 0);
  CHECK_THAT(result.err, Catch::Contains("warm start: attempt 1's workers start cold: the warm "
                                         "template was still importing after 30 s"));
  CHECK_THAT(result.out,
             Catch::Contains("attempt 1 rank 0") && Catch::Contains("attempt 1 rank 1"));
}
