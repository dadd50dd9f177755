// --warm_start (issue 29): a Python worker forked from ddprun's warm template is an exec'd one,
// field by field; a warm start that should not happen falls back to exec'd workers with one
// line saying why, and never fails the job; nothing outlives a kill -9 of ddprun. Each case
// runs against the PyTorch of DDP_TEST_PYTHON (both peers: [torch]).

#include <algorithm>
#include <catch2/catch.hpp>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "process_harness.hpp"
#include "test_support.hpp"

using namespace ddp::test;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string script(const std::string& name) {
  return source_path("tests/launcher/agent/python/" + name).string();
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

json read_json(const fs::path& path) {
  std::ifstream in(path);
  REQUIRE(in.good());
  return json::parse(in);
}

// What warm_fields.py wrote, less what differs between any two rounds (the agent's descriptor
// numbers for the record page and stack file): those descriptors are compared as the set of
// files open.
json comparable(json fields) {
  fields["env"].erase("DDPRUN_RECORD_FD");
  fields["env"].erase("DDPRUN_STACK_FD");
  std::vector<std::string> files;
  for (const auto& [fd, link] : fields["descriptors"].items()) files.push_back(link);
  std::sort(files.begin(), files.end());
  fields["descriptors"] = {{"0", fields["descriptors"]["0"]},
                           {"1", fields["descriptors"]["1"]},
                           {"2", fields["descriptors"]["2"]},
                           {"files", files}};
  fields.erase("torch_seed");  // drawn afresh by every process: compared across ranks below
  return fields;
}

// The installed modules of warm_site, copied where a test may change them.
fs::path copy_site(const fs::path& into) {
  const fs::path site = into / "site-packages";
  fs::copy(source_path("tests/launcher/agent/python/warm_site/site-packages"), site,
           fs::copy_options::recursive);
  return site;
}

}  // namespace

TEST_CASE(
    "a restarted worker forked from the warm template sees what an exec'd one sees: "
    "environment, argv, sys.path, streams, descriptors, signals, limits, its own session",
    "[torch]") {
  const std::string streams = GENERATE(std::string(""), "--tee=3", "--redirects=3");
  TempDir out;
  TempDir logs;
  std::vector<std::string> argv = {bin_path("ddprun").string(), "--nproc_per_node=2",
                                   "--max_restarts=1", "--log_dir=" + logs.path().string()};
  if (!streams.empty()) argv.push_back(streams);
  argv.insert(argv.end(), {script("warm_fields.py"), out.path().string(), "crash"});
  const ProcessResult result =
      run_process(argv, {{"PYTHON_EXEC", torch_python()}}, {}, milliseconds(180000));
  INFO("streams: " << streams << "\nstderr:\n" << result.err << "\nstdout:\n" << result.out);
  REQUIRE(result.status == 0);
  CHECK_THAT(result.err, Catch::Contains("warm start: attempt 1's 2 workers were forked"));
  for (int rank = 0; rank < 2; ++rank) {
    const std::string name = "_r" + std::to_string(rank) + ".json";
    const json cold = read_json(out.path() / ("a0" + name));
    const json warm = read_json(out.path() / ("a1" + name));
    const json cold_fields = comparable(cold["fields"]);
    const json warm_fields = comparable(warm["fields"]);
    for (auto field = cold_fields.begin(); field != cold_fields.end(); ++field) {
      INFO("rank " << rank << ", field " << field.key());
      CHECK(warm_fields.value(field.key(), json()).dump(1) == field.value().dump(1));
    }
    CHECK(warm["fields"]["parent_death_signal"] == SIGKILL);
    CHECK(warm["fields"]["own_session"] == true);
  }
  // What a process draws from the system's entropy differs between ranks, as exec'd.
  const json warm0 = read_json(out.path() / "a1_r0.json");
  const json warm1 = read_json(out.path() / "a1_r1.json");
  CHECK(warm0["draws"]["random"] != warm1["draws"]["random"]);
  CHECK(warm0["draws"]["numpy"] != warm1["draws"]["numpy"]);
  CHECK(warm0["fields"]["torch_seed"] != warm1["fields"]["torch_seed"]);
}

TEST_CASE(
    "always-warm starts (--warm_start=always) fork the first attempt, a worker's uncaught "
    "exception prints the "
    "traceback an exec'd worker prints and exits 1, and the template never imports the program's "
    "own modules",
    "[torch]") {
  std::map<std::string, std::string> tracebacks;
  for (const std::string mode : {"off", "always"}) {
    TempDir out;
    TempDir logs;
    const fs::path marker = out.path() / "marker";
    const ProcessResult result = run_process(
        {bin_path("ddprun").string(), "--nproc_per_node=2", "--warm_start=" + mode, "--redirects=3",
         "--log_dir=" + logs.path().string(), script("warm_job.py"), "raise", out.path().string()},
        {{"PYTHON_EXEC", torch_python()}, {"WARM_MARKER", marker.string()}}, {},
        milliseconds(180000));
    INFO("mode " << mode << "\nstderr:\n" << result.err << "\nstdout:\n" << result.out);
    CHECK(result.status != 0);
    CHECK_THAT(result.err, Catch::Contains("rank      : 1 (local_rank: 1)"));
    CHECK_THAT(result.err, Catch::Contains("exit      : exit code 1"));
    if (mode == "always") {
      CHECK_THAT(result.err, Catch::Contains("warm start: attempt 0's 2 workers were forked"));
    }
    // One import per worker, none by the template.
    const std::string imports = read_file(marker);
    CHECK(std::count(imports.begin(), imports.end(), '\n') == 2);
    for (const auto& attempt : fs::recursive_directory_iterator(logs.path())) {
      if (attempt.path().filename() == "stderr.log" &&
          attempt.path().parent_path().filename() == "1") {
        tracebacks[mode] = read_file(attempt.path());
      }
    }
  }
  CHECK_THAT(tracebacks["off"], Catch::Contains("ValueError: boom from rank 1"));
  CHECK(tracebacks["always"] == tracebacks["off"]);
}

TEST_CASE(
    "a warm start that should not happen starts the workers cold with one line saying why, "
    "and the job succeeds: a preloaded module started a thread, changed on disk, or the "
    "template was killed",
    "[torch]") {
  const auto [mode, why] = GENERATE(table<std::string, std::string>({
      {"thread", "threads after its imports"},
      {"changed", "changed since the template imported it"},
      {"killed", "warm template"},
  }));
  TempDir out;
  TempDir logs;
  const fs::path site = copy_site(out.path());
  const ProcessResult result = run_process(
      {bin_path("ddprun").string(), "--nproc_per_node=2", "--max_restarts=1",
       "--log_dir=" + logs.path().string(), script("warm_job.py"), mode, out.path().string()},
      {{"PYTHON_EXEC", torch_python()},
       {"PYTHONPATH", site.string()},
       {"WARM_MARKER", (out.path() / "marker").string()}},
      {}, milliseconds(180000));
  INFO("mode " << mode << "\nstderr:\n" << result.err << "\nstdout:\n" << result.out);
  CHECK(result.status == 0);
  CHECK_THAT(result.err, Catch::Contains("attempt 1's workers start cold") && Catch::Contains(why));
  CHECK_THAT(result.out,
             Catch::Contains("attempt 1 rank 0") && Catch::Contains("attempt 1 rank 1"));
}

TEST_CASE("kill -9 of ddprun leaves neither its warm template nor the workers it forked",
          "[torch]") {
  TempDir out;
  TempDir logs;
  ChildProcess job(
      {bin_path("ddprun").string(), "--nproc_per_node=2", "--warm_start=always",
       "--log_dir=" + logs.path().string(), script("warm_job.py"), "wait", out.path().string()},
      {{"PYTHON_EXEC", torch_python()}, {"WARM_MARKER", (out.path() / "marker").string()}});
  const std::vector<std::string> ready =
      job.wait_for_stdout_lines("ready ", 2, milliseconds(120000));
  std::vector<pid_t> pids;
  for (const std::string& line : ready) pids.push_back(std::stoi(line.substr(line.find(' ') + 1)));
  // The template: ddprun's child that runs _ddprun_template.py.
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string cmdline = read_file(entry.path() / "cmdline");
    const std::string stat = read_file(entry.path() / "stat");
    if (cmdline.find("_ddprun_template.py") == std::string::npos) continue;
    std::istringstream fields(stat.substr(stat.rfind(')') + 2));
    std::string state;
    pid_t parent = 0;
    fields >> state >> parent;
    // (the workers it forked show its command line too)
    const pid_t pid = std::stoi(entry.path().filename().string());
    if (parent == job.pid() && std::find(pids.begin(), pids.end(), pid) == pids.end()) {
      pids.push_back(pid);
    }
  }
  REQUIRE(pids.size() == 3);
  job.signal(SIGKILL);
  job.wait(milliseconds(10000));
  for (const pid_t pid : pids) {
    INFO("pid " << pid);
    CHECK(wait_for_process_exit(pid, milliseconds(10000)));
  }
}
