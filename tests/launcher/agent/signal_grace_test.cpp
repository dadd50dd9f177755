// Preemption keeps its checkpoints (issue 36): a second signal to ddprun never shortens the
// workers' grace; SIGKILL comes only at the end of --shutdown_timeout. The workers write a
// checkpoint from their signal handler (python/checkpoint_on_signal.py, plain Python).
// Also what ddprun leaves to a scheduler after a signal: its exit status and its
// TORCHELASTIC_ERROR_FILE, as torchrun's.

#include <catch2/catch.hpp>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "process_harness.hpp"
#include "skip.hpp"
#include "test_support.hpp"

using namespace ddp::test;
namespace fs = std::filesystem;

namespace {

// Two workers of checkpoint_on_signal.py under ddprun with a grace far longer than the test.
struct CheckpointJob {
  TempDir out;
  std::unique_ptr<ChildProcess> ddprun;

  explicit CheckpointJob(std::vector<std::string> options,
                         std::map<std::string, std::string> env = {}) {
    std::vector<std::string> argv = {bin_path("ddprun").string(), "--nproc_per_node=2",
                                     "--shutdown_timeout=600"};
    argv.insert(argv.end(), options.begin(), options.end());
    argv.push_back(source_path("tests/launcher/agent/python/checkpoint_on_signal.py").string());
    argv.push_back(out.path().string());
    env["PYTHON_EXEC"] = torch_python();
    ddprun = std::make_unique<ChildProcess>(argv, env);
    ddprun->wait_for_stdout_lines("training rank=", 2, milliseconds(60000));
  }

  // Both ranks' checkpoints, chunk by chunk: 20 lines each when complete.
  void check_checkpoints_complete() const {
    for (const char* rank : {"0", "1"}) {
      std::ifstream in(out.path() / (std::string("checkpoint-") + rank));
      int lines = 0;
      for (std::string line; std::getline(in, line);) ++lines;
      INFO("rank " << rank);
      CHECK(lines == 20);
    }
  }
};

}  // namespace

TEST_CASE("SIGTERM twice: the checkpoints complete, torchrun's exit status and error file") {
  if (!fs::exists(torch_python())) return skip(torch_python() + " does not exist");
  TempDir outer;
  const fs::path error_file = outer.path() / "ddprun-error.json";
  CheckpointJob job({"--exit_code=torchrun"}, {{"TORCHELASTIC_ERROR_FILE", error_file.string()}});
  job.ddprun->signal(SIGTERM);
  job.ddprun->wait_for_stdout_lines("checkpoint started", 2, milliseconds(60000));
  job.ddprun->signal(SIGTERM);  // as `timeout`, a container runtime or Slurm may send it
  const ProcessResult result = job.ddprun->wait(milliseconds(60000));
  INFO("stderr:\n" << result.err << "\nstdout:\n" << result.out);
  job.check_checkpoints_complete();
  CHECK_THAT(result.err, Catch::Contains("SIGTERM again: the workers have it already"));
  CHECK_THAT(result.err, !Catch::Contains("sending SIGKILL"));
  CHECK(result.status == 1);  // torchrun: its SignalException
  std::ifstream in(error_file);
  REQUIRE(in.good());
  const auto json = nlohmann::json::parse(in);
  CHECK(json["message"]["message"] ==
        "SignalException: Process " + std::to_string(job.ddprun->pid()) + " got signal: 15");
  CHECK(json["message"]["extraInfo"]["timestamp"].is_string());
}

TEST_CASE("a double Ctrl-C: the checkpoints complete") {
  if (!fs::exists(torch_python())) return skip(torch_python() + " does not exist");
  CheckpointJob job({});
  job.ddprun->signal(SIGINT);
  job.ddprun->wait_for_stdout_lines("checkpoint started", 2, milliseconds(60000));
  job.ddprun->signal(SIGINT);
  const ProcessResult result = job.ddprun->wait(milliseconds(60000));
  INFO("stderr:\n" << result.err << "\nstdout:\n" << result.out);
  job.check_checkpoints_complete();
  CHECK(result.status == 128 + SIGINT);  // --exit_code=root_cause (the tests' PET_EXIT_CODE)
  CHECK_THAT(result.err, Catch::Contains("SIGINT again"));
}

TEST_CASE(
    "SIGUSR1 then SIGTERM: the warning is forwarded, then SIGTERM, and the checkpoints "
    "complete") {
  if (!fs::exists(torch_python())) return skip(torch_python() + " does not exist");
  CheckpointJob job({"--signals_to_handle=SIGUSR1,SIGTERM"});
  job.ddprun->signal(SIGUSR1);
  job.ddprun->wait_for_stdout_lines("warning noted", 2, milliseconds(60000));
  job.ddprun->signal(SIGTERM);
  job.ddprun->wait_for_stdout_lines("checkpoint started", 2, milliseconds(60000));
  const ProcessResult result = job.ddprun->wait(milliseconds(60000));
  INFO("stderr:\n" << result.err << "\nstdout:\n" << result.out);
  job.check_checkpoints_complete();
  CHECK_THAT(result.out, Catch::Contains("on SIGTERM"));
  CHECK_THAT(result.err, Catch::Contains("got SIGTERM: forwarding it to the workers too"));
  CHECK(result.status == 128 + SIGUSR1);  // the signal that began the shutdown
}
