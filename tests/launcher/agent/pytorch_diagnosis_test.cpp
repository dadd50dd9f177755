// PyTorch jobs under ddprun, with its Python probe (worker/python): a hang is seen and
// named with the stuck rank's Python stack, a desync is stopped at once, a slow rank is only
// warned about, a failure stops the others with SIGTERM so that their handlers run, output
// is never dropped, the probe can be turned off, and the timeline has every rank's
// collectives. Each case runs against the PyTorch of DDP_TEST_PYTHON (1.13: DDP step records
// and torch.distributed's Python collectives; 2.14: c10d's collective hooks).

#include <catch2/catch.hpp>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "process_harness.hpp"
#include "skip.hpp"
#include "test_support.hpp"

using namespace ddp::test;

namespace {

std::string script(const std::string& name) {
  return source_path("tests/launcher/agent/python/" + name).string();
}

// The line number of the first line of the script that contains needle.
int line_of(const std::string& name, const std::string& needle) {
  std::ifstream in(script(name));
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.find(needle) != std::string::npos) return number;
  }
  return -1;
}

std::vector<std::string> ddprun(const std::filesystem::path& logs,
                                const std::vector<std::string>& options,
                                const std::vector<std::string>& command) {
  std::vector<std::string> argv = {bin_path("ddprun").string(), "--nproc_per_node=2",
                                   "--log_dir=" + logs.string()};
  argv.insert(argv.end(), options.begin(), options.end());
  argv.insert(argv.end(), command.begin(), command.end());
  return argv;
}

// The lines of many_lines.py (n lines) run under ddprun with options, its output (2>&1)
// read by a shell loop a byte at a time, far slower than the worker writes.
std::vector<std::string> lines_through_slow_pipe(const std::string& options, int n) {
  TempDir dir;
  const auto out = dir.path() / "out.txt";
  const ShellResult run = run_shell(
      "PYTHON_EXEC='" + torch_python() + "' " + bin_path("ddprun").string() +
          " --nproc_per_node=1 " + options + " --log_dir=" + dir.path().string() + " " +
          script("many_lines.py") + " " + std::to_string(n) +
          " 2>&1 | (while IFS= read -r l; do printf '%s\\n' \"$l\"; done) > " + out.string(),
      280);
  INFO(run.output);
  REQUIRE(run.status == 0);
  std::ifstream in(out);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(std::move(line));
  return lines;
}

const std::map<std::string, std::string>& python_env() {
  static const std::map<std::string, std::string> env = {{"PYTHON_EXEC", torch_python()}};
  return env;
}

}  // namespace

TEST_CASE(
    "PyTorch DDP, rank 1 stuck in its loader: warned with its Python stack and CPU use, "
    "kill -USR1 shows it, and the job goes on to exit 0",
    "[torch]") {
  if (!torch_available())
    return skip(torch_python() + " cannot import torch.distributed with Gloo");
  TempDir logs;
  ChildProcess job(ddprun(logs.path(), {"--hang_timeout=3"},
                          {script("ddp_job.py"), "--steps", "8", "--step-seconds", "0.3",
                           "--stuck-rank", "1", "--stuck-step", "4", "--stuck-seconds", "14"}),
                   python_env());
  // The warning comes at --hang_timeout after rank 0 began waiting (and a tick, and the
  // stacks), while rank 1 still sleeps: well within its 14 s.
  job.wait_for_stderr("ddprun: warning: the job hung at collective", milliseconds(40000));
  job.signal(SIGUSR1);
  job.wait_for_stderr("ddprun: collectives now (kill -USR1): ", milliseconds(20000));
  const ProcessResult result = job.wait(milliseconds(90000));
  INFO("stderr:\n" << result.err << "\nstdout:\n" << result.out);
  CHECK(result.status == 0);
  CHECK_THAT(result.out, Catch::Contains("done rank 0") && Catch::Contains("done rank 1"));
  const std::string loader = "1 rank (rank 1): in load_batch (ddp_job.py:" +
                             std::to_string(line_of("ddp_job.py", "the stuck loader")) + ")";
  // The warning: the collective rank 0 waits in, rank 1 never entered it, its stack, and
  // that it sleeps (no CPU, no I/O).
  const auto warning = result.err.find("ddprun: warning: the job hung at collective");
  REQUIRE(warning != std::string::npos);
  const std::string report = result.err.substr(warning);
  CHECK_THAT(report, Catch::Contains("rank 0 has waited in it for"));
  CHECK_THAT(report, Catch::Contains("rank 1 (") && Catch::Contains("never entered it"));
  CHECK_THAT(report, Catch::Contains("where each Python worker is (ddprun's Python probe):"));
  CHECK_THAT(report, Catch::Contains(loader));
  CHECK_THAT(report, Catch::Contains("blocked, not busy"));
  CHECK_THAT(report, Catch::Contains("ddprun lets the job run"));
  // kill -USR1: each rank's collectives and live stacks.
  const auto usr1 = result.err.find("ddprun: collectives now (kill -USR1): ");
  REQUIRE(usr1 != std::string::npos);
  CHECK_THAT(result.err.substr(usr1), Catch::Contains("where each Python worker is:"));
  CHECK_THAT(result.err, Catch::Contains("ddprun: the job moves again"));
  CHECK_THAT(result.err, !Catch::Contains("ddprun stops the job now"));
}

TEST_CASE(
    "PyTorch DDP with uneven inputs: rank 1 in barrier() while rank 0 reduces gradients "
    "is a desync, named and stopped at once",
    "[torch]") {
  if (!torch_available())
    return skip(torch_python() + " cannot import torch.distributed with Gloo");
  TempDir logs;
  const ProcessResult result =
      run_process(ddprun(logs.path(), {"--hang_timeout=3", "--shutdown_timeout=5"},
                         {script("ddp_job.py"), "--steps", "6", "--fewer-batches", "1:3"}),
                  python_env(), {}, milliseconds(90000));
  INFO("stderr:\n" << result.err);
  CHECK(result.status != 0);
  CHECK_THAT(result.err, Catch::Contains("its ranks called it differently (a desync): "));
  CHECK_THAT(result.err, Catch::Contains("rank 1 called barrier"));
  CHECK_THAT(result.err, Catch::Contains("rank 0 called "));
  CHECK_THAT(result.out, !Catch::Contains("done rank"));
}

// Issue 28: the probe once numbered every group's collectives in one sequence, and called
// this healthy job a desync ("rank 0 called barrier; rank 1 called all_reduce") and stopped it.
TEST_CASE(
    "PyTorch: rank 0's collective on a group of its own, then slow: a wait named, no desync, "
    "the job exits 0",
    "[torch]") {
  if (!torch_available())
    return skip(torch_python() + " cannot import torch.distributed with Gloo");
  TempDir logs;
  const ProcessResult result = run_process(
      ddprun(logs.path(), {"--hang_timeout=3"}, {script("uneven_groups.py"), "subgroup"}),
      python_env(), {}, milliseconds(90000));
  INFO("stderr:\n" << result.err << "\nstdout:\n" << result.out);
  CHECK(result.status == 0);
  CHECK_THAT(result.out, Catch::Contains("done rank 0") && Catch::Contains("done rank 1"));
  CHECK_THAT(result.err, Catch::Contains("ddprun: warning: the job hung at collective"));
  CHECK_THAT(result.err, Catch::Contains("rank 0 (") && Catch::Contains("never entered it"));
  CHECK_THAT(result.err, !Catch::Contains("desync"));
  CHECK_THAT(result.err, !Catch::Contains("ddprun stops the job now"));
}

// Issue 28: Gloo's irecv has no future; the probe marked it finished when issued, and a rank
// blocked in its wait went unseen.
TEST_CASE("PyTorch: a rank blocked in irecv().wait() is named with its peer at --hang_timeout",
          "[torch]") {
  if (!torch_available())
    return skip(torch_python() + " cannot import torch.distributed with Gloo");
  TempDir logs;
  const ProcessResult result =
      run_process(ddprun(logs.path(), {"--hang_timeout=3"}, {script("uneven_groups.py"), "recv"}),
                  python_env(), {}, milliseconds(90000));
  INFO("stderr:\n" << result.err << "\nstdout:\n" << result.out);
  CHECK(result.status == 0);
  CHECK_THAT(result.err, Catch::Contains("ddprun: warning: the job hung at a point-to-point "
                                         "wait: rank 1 (") &&
                             Catch::Contains("has waited in recv from rank 0 (16 B) for"));
  CHECK_THAT(result.err, !Catch::Contains("ddprun stops the job now"));
}

TEST_CASE("PyTorch: a rank that calls all_reduce with another shape is a desync, both named",
          "[torch][sanitize]") {
  if (!torch_available())
    return skip(torch_python() + " cannot import torch.distributed with Gloo");
  TempDir logs;
  const ProcessResult result =
      run_process(ddprun(logs.path(), {"--hang_timeout=3", "--shutdown_timeout=5"},
                         {script("allreduce_shape.py")}),
                  python_env(), {}, milliseconds(90000));
  INFO("stderr:\n" << result.err);
  CHECK(result.status != 0);
  CHECK_THAT(result.err, Catch::Contains("collective 3"));
  CHECK_THAT(result.err, Catch::Contains("(a desync): "));
  CHECK_THAT(result.err, Catch::Contains("rank 0 called all_reduce of 4 float32"));
  CHECK_THAT(result.err, Catch::Contains("rank 1 called all_reduce of 3 float32"));
}

TEST_CASE(
    "PyTorch: after a failure, a survivor sleeping outside a collective gets SIGTERM and "
    "its handler runs",
    "[torch]") {
  if (!torch_available())
    return skip(torch_python() + " cannot import torch.distributed with Gloo");
  TempDir logs;
  const ProcessResult result = run_process(ddprun(logs.path(), {}, {script("term_handler.py")}),
                                           python_env(), {}, milliseconds(60000));
  INFO("stderr:\n" << result.err << "\nstdout:\n" << result.out);
  CHECK(result.status == 1);
  CHECK_THAT(result.out, Catch::Contains("rank 1: SIGTERM handler ran: checkpoint saved"));
  CHECK_THAT(result.err, !Catch::Contains("Fatal Python error"));
  CHECK_THAT(result.err, Catch::Contains("RuntimeError: rank 0 fails on purpose"));
}

TEST_CASE(
    "a Python worker's 400,000 lines through a slowly read pipe all arrive, stdout and "
    "stderr in their order",
    "[torch]") {
  if (!torch_available())
    return skip(torch_python() + " cannot import torch.distributed with Gloo");
  int next = 0;
  std::vector<std::string> other;
  for (const std::string& line : lines_through_slow_pipe("", 400000)) {
    if (line == "line " + std::to_string(next)) {
      ++next;
    } else if (!line.starts_with("line ")) {
      other.push_back(line);  // ddprun's own lines
    } else {
      FAIL("out of order: " << line << " where line " << next << " was due");
    }
  }
  CHECK(next == 400000);
  for (const std::string& o : other) CHECK_THAT(o, !Catch::Contains("dropped"));
}

TEST_CASE(
    "with --tee, 200,000 lines through a slowly read pipe all arrive, each stream in its "
    "order: ddprun slows the worker instead of dropping lines",
    "[torch]") {
  if (!torch_available())
    return skip(torch_python() + " cannot import torch.distributed with Gloo");
  int next_even = 0, next_odd = 1;
  for (const std::string& line : lines_through_slow_pipe("--tee=3", 200000)) {
    CHECK_THAT(line, !Catch::Contains("dropped"));
    if (!line.starts_with("[default0]:line ")) continue;
    const int number = std::stoi(line.substr(16));
    int& next = number % 2 == 0 ? next_even : next_odd;
    if (number != next) FAIL("out of order: " << line << " where line " << next << " was due");
    next += 2;
  }
  CHECK(next_even == 200000);
  CHECK(next_odd == 200001);
}

TEST_CASE(
    "the Python probe: off with --skip_python_probe or DDPRUN_PYTHON_PROBE=0, and when "
    "on invisible to the program and chained to the user's sitecustomize",
    "[torch]") {
  if (!torch_available())
    return skip(torch_python() + " cannot import torch.distributed with Gloo");
  TempDir dir;
  const auto user = dir.path() / "user";
  std::filesystem::create_directories(user);
  std::ofstream(user / "sitecustomize.py") << "print('user sitecustomize ran', flush=True)\n";
  const auto show = dir.path() / "show.py";
  std::ofstream(show) << "import os, sys\n"
                         "print('PYTHONPATH=' + os.environ.get('PYTHONPATH', '<unset>'))\n"
                         "print('probe on sys.path:', any('ddprun' in p for p in sys.path))\n"
                         "print('probe loaded:', '_ddprun_probe' in sys.modules)\n";
  const auto run = [&](const std::vector<std::string>& options,
                       std::map<std::string, std::string> env) {
    env["PYTHON_EXEC"] = torch_python();
    env["PYTHONPATH"] = user.string();
    std::vector<std::string> argv = {bin_path("ddprun").string(), "--nproc_per_node=1",
                                     "--log_dir=" + dir.path().string()};
    argv.insert(argv.end(), options.begin(), options.end());
    argv.push_back(show.string());
    return run_process(argv, env, {}, milliseconds(60000));
  };
  const ProcessResult on = run({}, {});
  INFO("probe on:\n" << on.out << on.err);
  CHECK(on.status == 0);
  CHECK_THAT(on.out, Catch::Contains("user sitecustomize ran"));
  CHECK_THAT(on.out, Catch::Contains("PYTHONPATH=" + user.string() + "\n"));
  CHECK_THAT(on.out, Catch::Contains("probe on sys.path: False"));
  CHECK_THAT(on.out, Catch::Contains("probe loaded: True"));
  for (const ProcessResult& off :
       {run({"--skip_python_probe"}, {}), run({}, {{"DDPRUN_PYTHON_PROBE", "0"}})}) {
    INFO("probe off:\n" << off.out << off.err);
    CHECK(off.status == 0);
    CHECK_THAT(off.out, Catch::Contains("user sitecustomize ran"));
    CHECK_THAT(off.out, Catch::Contains("PYTHONPATH=" + user.string() + "\n"));
    CHECK_THAT(off.out, Catch::Contains("probe loaded: False"));
  }
}

TEST_CASE("the timeline of a 2-rank PyTorch DDP run has every rank's collective spans", "[torch]") {
  if (!torch_available())
    return skip(torch_python() + " cannot import torch.distributed with Gloo");
  TempDir dir;
  const auto trace_path = dir.path() / "trace.json";
  const ProcessResult result =
      run_process(ddprun(dir.path(), {"--trace_file=" + trace_path.string()},
                         {script("ddp_job.py"), "--steps", "4"}),
                  python_env(), {}, milliseconds(60000));
  INFO("stderr:\n" << result.err);
  REQUIRE(result.status == 0);
  // No warning that torchrun's jobs do not print: PyTorch 2.10+ warns about the old Flight
  // Recorder names ddprun sets for older ones, unless the probe drops them.
  CHECK_THAT(result.err, !Catch::Contains("is deprecated"));
  std::ifstream in(trace_path);
  REQUIRE(in.good());
  const nlohmann::json trace = nlohmann::json::parse(in);
  std::map<int, int> collectives_of_rank;
  for (const nlohmann::json& e : trace.at("traceEvents")) {
    if (e.value("cat", "") == "collective") ++collectives_of_rank[e.at("tid").get<int>()];
  }
  // At least the 4 steps' gradient reductions and the final barrier, on each rank.
  CHECK(collectives_of_rank[0] >= 5);
  CHECK(collectives_of_rank[1] >= 5);
}

TEST_CASE(
    "the probe's own check (probe_check.py: the page it writes, stacks, chaining, off, "
    "python -I, forks, internal errors, no frame of its own in tracebacks) passes",
    "[torch]") {
  if (!torch_available())
    return skip(torch_python() + " cannot import torch.distributed with Gloo");
  // The probe as built, beside build/bin/ddprun: with its native wrapper.
  const auto probe = bin_path("ddprun").parent_path().parent_path() / "share/ddprun/python";
  const ShellResult run =
      run_shell("DDP_PROBE_FOLDER=" + probe.string() + " " + torch_python() + " " +
                    source_path("tests/worker/python/probe_check.py").string(),
                280);
  INFO(run.output);
  CHECK(run.status == 0);
}
