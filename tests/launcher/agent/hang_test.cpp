// Hang diagnosis end to end: ddprun over real libddp workers (ddp-hang-worker) that hang on
// purpose. ddprun must stop the job within --hang_timeout and a few seconds, and its report's
// first line must name the collective and the rank to blame.
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "fake_nccl_ras.hpp"
#include "process_harness.hpp"
#include "skip.hpp"
#include "test_support.hpp"

using namespace ddp::test;

namespace {

std::vector<std::string> hang_job(const std::filesystem::path& logs, int nproc,
                                  const std::vector<std::string>& worker_args,
                                  const std::string& hang_timeout = "2") {
  std::vector<std::string> argv = {
      bin_path("ddprun").string(), "--nproc_per_node=" + std::to_string(nproc),
      "--hang_timeout=" + hang_timeout, "--shutdown_timeout=5", "--log_dir=" + logs.string()};
  argv.push_back(bin_path("ddp-hang-worker").string());
  argv.insert(argv.end(), worker_args.begin(), worker_args.end());
  return argv;
}

// The first line ddprun printed that starts with "ddprun: the job hung".
std::string verdict_line(const std::string& err) {
  std::istringstream lines(err);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("ddprun: the job hung", 0) == 0) return line;
  }
  return "";
}

// Runs the job to its end; returns its result and how long it took.
std::pair<ProcessResult, double> run_timed_env(const std::vector<std::string>& argv,
                                               const std::map<std::string, std::string>& env) {
  const auto start = std::chrono::steady_clock::now();
  ProcessResult result = run_process(argv, env, {}, milliseconds(90000));
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return {result, took};
}

std::pair<ProcessResult, double> run_timed(const std::vector<std::string>& argv) {
  return run_timed_env(argv, {});
}

}  // namespace

TEST_CASE("hang: a rank that never enters the 3rd all-reduce is named, with the collective") {
  TempDir logs;
  // NCCL's RAS service, as a stand-in named by NCCL_RAS_ADDR (asked even without NCCL ranks).
  FakeNcclRas ras("Errors\n======\nCommunicator 0x1: rank 2 is missing\n");
  auto [result, took] =
      run_timed_env(hang_job(logs.path(), 4, {"--steps", "5", "--rank", "2", "--skip", "3"}),
                    {{"NCCL_RAS_ADDR", ras.address()}});
  INFO("stderr:\n" << result.err);
  CHECK(result.status != 0);
  CHECK(took < 30);  // --hang_timeout=2 and the stop; nowhere near a collective timeout
  const std::string verdict = verdict_line(result.err);
  REQUIRE_FALSE(verdict.empty());
  CHECK_THAT(verdict, Catch::StartsWith("ddprun: the job hung at collective 3 (all_reduce"));
  CHECK_THAT(verdict, Catch::Contains("ranks 0, 1, 3 have waited in it"));
  CHECK_THAT(verdict, Catch::Contains("rank 2 ("));
  CHECK_THAT(verdict, Catch::Contains("never entered it: its last finished collective is 2"));
  // The failure report names rank 2 as the root cause, hung.
  CHECK_THAT(result.err, Catch::Contains("hung: stopped by ddprun (the verdict and why it "
                                         "stopped are above)"));
  // Certain at once: the rank the others wait for has exited.
  CHECK_THAT(result.err, Catch::Contains("ddprun stops the job now: rank 2 ("));
  CHECK_THAT(result.err, Catch::Contains("which the others wait for, has exited (exit code 0)"));
  CHECK_THAT(result.err, !Catch::Contains("ddprun: warning: the job hung"));
  CHECK_THAT(result.err, Catch::Contains("  rank      : 2 (local_rank: 2)"));
  // What RAS said is part of the report.
  CHECK_THAT(result.err, Catch::Contains("NCCL's RAS service (" + ras.address() +
                                         ") says:\n  Errors\n  ======\n"
                                         "  Communicator 0x1: rank 2 is missing\n"));
}

// Issue 24: a process's second communicator is recorded too, and a hang there is named with it.
TEST_CASE("hang: a rank that never enters a collective of the second communicator is named") {
  TempDir logs;
  auto [result, took] = run_timed(
      hang_job(logs.path(), 3, {"--steps", "5", "--rank", "1", "--skip", "3", "--second", "1"}));
  INFO("stderr:\n" << result.err);
  CHECK(result.status != 0);
  CHECK(took < 30);
  const std::string verdict = verdict_line(result.err);
  REQUIRE_FALSE(verdict.empty());
  CHECK_THAT(verdict, Catch::StartsWith("ddprun: the job hung in communicator 2 (gloo) at "
                                        "collective 3 (all_reduce"));
  CHECK_THAT(verdict, Catch::Contains("never entered it: its last finished collective is 2"));
  CHECK_THAT(result.err, Catch::Contains("ddprun stops the job now: rank 1 ("));
}

TEST_CASE("hang: a rank blocked before a collective is named, with each worker's stack") {
  TempDir logs;
  std::vector<std::string> argv =
      hang_job(logs.path(), 2, {"--steps", "5", "--rank", "1", "--sleep-before", "2"});
  argv.insert(argv.begin() + 1, "--hang_stop_timeout=5");
  auto [result, took] = run_timed(argv);
  INFO("stderr:\n" << result.err);
  CHECK(result.status != 0);
  CHECK(took < 30);
  // Warned first (the blocked rank runs on: not certain), stopped at --hang_stop_timeout.
  const auto warning = result.err.find("ddprun: warning: the job hung at collective 2");
  REQUIRE(warning != std::string::npos);
  CHECK(result.err.find("ddprun lets the job run: it stops it if a rank the others wait for "
                        "exits, or once they have waited 5.0 s (--hang_stop_timeout") !=
        std::string::npos);
  // Its evidence: rank 1 sleeps.
  CHECK_THAT(result.err, Catch::Contains("what each rank to blame did meanwhile:\n  rank 1 ("));
  CHECK_THAT(result.err, Catch::Contains("blocked, not busy"));
  CHECK_THAT(result.err, Catch::Contains("ddprun stops the job now: the ranks have waited "));
  const std::string verdict = verdict_line(result.err);
  CHECK_THAT(verdict, Catch::StartsWith("ddprun: the job hung at collective 2 (all_reduce, 4.0 "
                                        "KiB float32): rank 0 has waited in it"));
  CHECK_THAT(verdict, Catch::Contains("rank 1 ("));
  CHECK_THAT(verdict, Catch::Contains("never entered it: its last finished collective is 1"));
  // Where each worker was: rank 1 in its sleep (eu-stack, when ptrace is allowed here).
  const auto attempt = [&] {
    for (const auto& entry : std::filesystem::recursive_directory_iterator(logs.path())) {
      if (entry.path().filename() == "hang.txt") return entry.path().parent_path();
    }
    return std::filesystem::path();
  }();
  REQUIRE_FALSE(attempt.empty());
  std::ifstream stack_file(attempt / "1" / "stack.txt");
  const std::string stack((std::istreambuf_iterator<char>(stack_file)), {});
  INFO("rank 1's stack file:\n" << stack);
  if (stack.find("eu-stack") == std::string::npos) {  // a stack, not why there is none
    CHECK_THAT(stack, Catch::Contains("nanosleep"));
    CHECK_THAT(result.err, Catch::Contains("where each worker was (eu-stack):"));
    CHECK_THAT(result.err, Catch::Contains("1 rank (1):"));
  }
}

TEST_CASE("hang: a rank slow for twice --hang_timeout is warned about, not stopped: exit 0") {
  TempDir logs;
  // Rank 1 spends 5 s before its 2nd all-reduce (a checkpoint, an evaluation): rank 0 waits.
  // The steps after it take long enough for the monitor to see the job move again.
  auto [result, took] = run_timed(hang_job(logs.path(), 2,
                                           {"--steps", "6", "--step-ms", "300", "--rank", "1",
                                            "--sleep-before", "2", "--sleep-ms", "5000"}));
  INFO("stderr:\n" << result.err);
  CHECK(result.status == 0);
  CHECK_THAT(result.err, Catch::Contains("ddprun: warning: the job hung at collective 2"));
  CHECK_THAT(result.err, Catch::Contains("ddprun lets the job run"));
  CHECK_THAT(result.err, Catch::Contains("ddprun: the job moves again"));
  CHECK_THAT(result.err, !Catch::Contains("ddprun stops the job now"));
  CHECK(std::count(result.out.begin(), result.out.end(), '\n') == 4);  // ready and done x2
}

TEST_CASE("desync: a rank that calls the collective with half the count fails, both named") {
  TempDir logs;
  auto [result, took] =
      run_timed(hang_job(logs.path(), 4, {"--steps", "5", "--rank", "3", "--half-count", "3"}));
  INFO("stderr:\n" << result.err);
  CHECK(result.status != 0);
  CHECK(took < 30);
  // libddp fails the collective on every rank at once, saying how they differ...
  CHECK_THAT(result.err, Catch::Contains("all_reduce desync: rank 3 called it with 512 f32"));
  // ...and ddprun's report says where every rank was: both groups, by their records.
  CHECK_THAT(result.err, Catch::Contains("  collective: collective 3 failed: its ranks called it "
                                         "differently (a desync): ranks 0-2 called all_reduce of "
                                         "1024 float32 (4.0 KiB); rank 3 called all_reduce of "
                                         "512 float32 (2.0 KiB)"));
}

TEST_CASE("kill -USR1 prints each rank's collective, and the job goes on to exit 0") {
  TempDir logs;
  ChildProcess job(hang_job(logs.path(), 2, {"--steps", "40", "--step-ms", "100"}, "0"));
  job.wait_for_stdout_lines("ready rank=", 2);
  // The communicator exists; give the record its first collective before asking.
  job.signal(SIGUSR1);
  job.wait_for_stderr("ddprun: collectives now (kill -USR1): ");
  const ProcessResult result = job.wait(milliseconds(60000));
  INFO("stderr:\n" << result.err);
  CHECK(result.status == 0);
  CHECK_THAT(result.err, Catch::Contains("  rank 0 ("));
  CHECK_THAT(result.err, Catch::Contains("  rank 1 ("));
  CHECK(std::count(result.out.begin(), result.out.end(), '\n') >= 4);  // ready and done x2
}

TEST_CASE("straggler: a rank 20 ms slower every step is named, and a balanced run names none") {
  TempDir logs;
  const ProcessResult slow = run_process(
      hang_job(logs.path(), 3,
               {"--steps", "150", "--reducer", "1", "--rank", "1", "--slow-ms", "20"}, "0"),
      {}, {}, milliseconds(60000));
  INFO("stderr:\n" << slow.err);
  REQUIRE(slow.status == 0);
  const auto at = slow.err.find("ddprun: rank 1 (");
  REQUIRE(at != std::string::npos);
  const std::string line = slow.err.substr(at, slow.err.find('\n', at) - at);
  CHECK_THAT(line, Catch::Contains(") is a straggler: its gradients were ready "));
  CHECK_THAT(line, Catch::Contains(" after the median rank's in "));
  // Named within 50 steps of the start (its window is 20) and the tick of the monitor.
  const int step = std::stoi(line.substr(line.rfind("as of step ") + 11));
  CHECK(step <= 60);
  // The end-of-job summary lists every rank's compute and wait time.
  CHECK_THAT(slow.err, Catch::Contains("ddprun: time in Reducer steps, per rank"));
  CHECK_THAT(slow.err, Catch::Contains("  rank 2: 150 steps, compute "));

  TempDir logs_balanced;
  const ProcessResult balanced =
      run_process(hang_job(logs_balanced.path(), 3,
                           {"--steps", "150", "--reducer", "1", "--step-ms", "5"}, "0"),
                  {}, {}, milliseconds(60000));
  INFO("balanced stderr:\n" << balanced.err);
  REQUIRE(balanced.status == 0);
  CHECK_THAT(balanced.err, !Catch::Contains("straggler"));
}

TEST_CASE(
    "a PyTorch rank blocked before all_reduce: the stop shows its Python stack, taken "
    "through the probe",
    "[torch][sanitize]") {
  if (!torch_available()) {
    return skip(torch_python() + " cannot import torch.distributed with Gloo");
  }
  TempDir logs;
  const std::vector<std::string> argv = {
      bin_path("ddprun").string(), "--nproc_per_node=2", "--log_dir=" + logs.path().string(),
      source_path("tests/launcher/agent/python/sleep_before_allreduce.py").string()};
  auto [result, took] = run_timed_env(argv, {{"PYTHON_EXEC", torch_python()}});
  INFO("stderr:\n" << result.err);
  CHECK(result.status == 1);  // rank 0's timeout
  CHECK(took < 60);           // not rank 1's 120 s sleep
  // No SIGABRT: the probe's faulthandler wrote the stack into its own file, not stderr, and
  // rank 1 then ended by the stop's SIGTERM, as under torchrun.
  CHECK_THAT(result.err, !Catch::Contains("Fatal Python error"));
  CHECK_THAT(result.err, !Catch::Contains("Aborted"));
  // ddprun's report of it, grouped, and the rank's file.
  CHECK_THAT(result.err,
             Catch::Contains("ddprun: where each Python worker was when it was stopped"));
  CHECK_THAT(result.err,
             Catch::Contains("  1 rank (rank 1): in <module> (sleep_before_allreduce.py:12)"));
  std::string stack_file;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(logs.path())) {
    if (entry.path().filename() == "python_stack.txt") stack_file = entry.path().string();
  }
  REQUIRE_FALSE(stack_file.empty());
  CHECK_THAT(stack_file, Catch::EndsWith("/attempt_0/1/python_stack.txt"));
  std::ifstream in(stack_file);
  const std::string dump((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK_THAT(dump, Catch::Contains("sleep_before_allreduce.py\", line 12 in <module>"));
}

TEST_CASE(
    "a PyTorch hang that ends in Gloo's timeout is no 'job moves again', and without --log_dir "
    "no stack path points into the removed temporary folder",
    "[torch]") {
  if (!torch_available()) {
    return skip(torch_python() + " cannot import torch.distributed with Gloo");
  }
  // --hang_timeout (1 s) below the process group's timeout (3 s): ddprun warns of the hang,
  // then rank 0's all_reduce fails, which moved nothing.
  const std::vector<std::string> argv = {
      bin_path("ddprun").string(), "--nproc_per_node=2", "--hang_timeout=1",
      "--hang_stop_timeout=600",
      source_path("tests/launcher/agent/python/sleep_before_allreduce.py").string()};
  auto [result, took] = run_timed_env(argv, {{"PYTHON_EXEC", torch_python()}});
  INFO("stderr:\n" << result.err);
  CHECK(result.status == 1);  // rank 0's timeout
  CHECK_THAT(result.err, Catch::Contains("ddprun: warning: the job hung at collective"));
  CHECK_THAT(result.err, !Catch::Contains("the job moves again"));
  CHECK_THAT(result.err,
             Catch::Contains("  1 rank (rank 1): in <module> (sleep_before_allreduce.py:12)"));
  CHECK_THAT(result.err, !Catch::Contains("python_stack.txt"));
}

TEST_CASE(
    "a PyTorch rank's stack is reported with --redirects too, and its stderr file holds "
    "no dump",
    "[torch]") {
  if (!torch_available()) {
    return skip(torch_python() + " cannot import torch.distributed with Gloo");
  }
  TempDir logs;
  const std::vector<std::string> argv = {
      bin_path("ddprun").string(), "--nproc_per_node=2", "--redirects=2",
      "--log_dir=" + logs.path().string(),
      source_path("tests/launcher/agent/python/sleep_before_allreduce.py").string()};
  auto [result, took] = run_timed_env(argv, {{"PYTHON_EXEC", torch_python()}});
  INFO("stderr:\n" << result.err);
  CHECK(result.status == 1);
  CHECK_THAT(result.err,
             Catch::Contains("  1 rank (rank 1): in <module> (sleep_before_allreduce.py:12)"));
  for (const auto& entry : std::filesystem::recursive_directory_iterator(logs.path())) {
    if (entry.path().filename() != "stderr.log") continue;
    std::ifstream in(entry.path());
    const std::string text((std::istreambuf_iterator<char>(in)), {});
    INFO(entry.path().string() << ":\n" << text);
    CHECK_THAT(text, !Catch::Contains("most recent call first"));
  }
}

TEST_CASE("Flight Recorder dumps after a failure are listed and PyTorch's analyser runs on them") {
  TempDir logs;
  const std::vector<std::string> argv = {
      bin_path("ddprun").string(), "--nproc_per_node=2", "--log_dir=" + logs.path().string(),
      source_path("tests/launcher/agent/python/fr_dump_and_fail.py").string()};
  // A stand-in analyser on PYTHONPATH (PyTorch 1.13 has none); python3 on PATH runs it.
  auto [result, took] = run_timed_env(
      argv, {{"PYTHONPATH", source_path("tests/launcher/agent/python/fake_fr").string()}});
  INFO("stderr:\n" << result.err);
  CHECK(result.status == 1);
  CHECK_THAT(result.err, Catch::Contains("ddprun: PyTorch's Flight Recorder left 2 dump(s):"));
  CHECK_THAT(result.err, Catch::Contains("/attempt_0/nccl_trace_rank_1"));
  CHECK_THAT(result.err, Catch::Contains("ddprun: PyTorch's Flight Recorder analyser ("));
  CHECK_THAT(result.err, Catch::Contains(" says:\n  stand-in analyser: 2 dumps: "
                                         "nccl_trace_rank_0 nccl_trace_rank_1\n"));
  CHECK_THAT(result.err, Catch::Contains("  stand-in analyser: rank 1 never joined collective 7"));
  // Before the failure report, which ends the output.
  CHECK(result.err.find("never joined") < result.err.find("Root Cause"));

  // Without an analyser (no torch at all for this python3): said, with the command.
  TempDir logs2;
  auto [plain, took2] = run_timed_env(
      {bin_path("ddprun").string(), "--nproc_per_node=1", "--log_dir=" + logs2.path().string(),
       source_path("tests/launcher/agent/python/fr_dump_and_fail.py").string()},
      {{"PYTHONPATH", ""}});
  INFO("stderr:\n" << plain.err);
  CHECK(plain.status == 1);
  CHECK_THAT(plain.err, Catch::Contains("ddprun: this PyTorch has no Flight Recorder analyser"));
}
