// --warm_start (issue 29): a Python worker forked from ddprun's warm template is an exec'd one,
// field by field; a warm start that should not happen falls back to exec'd workers with one
// line saying why, and never fails the job; nothing outlives a kill -9 of ddprun. Each case
// runs against the PyTorch of DDP_TEST_PYTHON (both peers: [torch]).

#include <algorithm>
#include <catch2/catch.hpp>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "process_harness.hpp"
#include "skip.hpp"
#include "test_support.hpp"

using namespace ddp::test;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string script(const std::string& name) {
  return source_path("tests/launcher/agent/python/" + name).string();
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
  json environ = json::array();
  for (const auto& entry : fields["proc_environ"]) {
    const std::string text = entry.get<std::string>();
    if (!text.starts_with("DDPRUN_RECORD_FD=") && !text.starts_with("DDPRUN_STACK_FD=")) {
      environ.push_back(text);
    }
  }
  fields["proc_environ"] = environ;
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
    "a restarted worker forked from the warm template sees what an exec'd one sees ("
    "environment, argv, sys.path, streams, descriptors, signals, limits, its own session)",
    "[torch]") {
  if (!torch_available()) {
    return skip(torch_python() + " cannot import torch.distributed with Gloo");
  }
  // How the entrypoint runs (a script, --run_path or -m, the last two through ddprun's -c
  // wrapper), and where the streams go (the console, pipes teed to files, files).
  const auto [entry, streams] = GENERATE(table<std::string, std::string>({
      {"script", ""},
      {"script", "--tee=3"},
      {"script", "--redirects=3"},
      {"--run_path", ""},
      {"-m", "--tee=1"},
      {"script", "--tee=3 --local_ranks_filter=1 --duplicate_stdout_filters=fields"},
  }));
  TempDir out;
  TempDir logs;
  // -m finds the module in the working directory: ddprun runs in the scripts' folder.
  std::vector<std::string> argv = {"/bin/sh",
                                   "-c",
                                   "cd \"$0\" && exec \"$@\"",
                                   source_path("tests/launcher/agent/python").string(),
                                   bin_path("ddprun").string(),
                                   "--nproc_per_node=2",
                                   "--max_restarts=1",
                                   "--warm_start=restart",
                                   "--log_dir=" + logs.path().string()};
  std::istringstream options(streams);
  for (std::string option; options >> option;) argv.push_back(option);
  if (entry == "-m") {
    argv.insert(argv.end(), {"-m", "warm_fields"});
  } else {
    if (entry != "script") argv.push_back(entry);
    argv.push_back(script("warm_fields.py"));
  }
  argv.insert(argv.end(), {out.path().string(), "crash"});
  const ProcessResult result =
      run_process(argv, {{"PYTHON_EXEC", torch_python()}}, {}, milliseconds(180000));
  INFO("entry: " << entry << ", streams: " << streams << "\nstderr:\n"
                 << result.err << "\nstdout:\n"
                 << result.out);
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
    "[torch][sanitize]") {
  if (!torch_available()) {
    return skip(torch_python() + " cannot import torch.distributed with Gloo");
  }
  // A script, or --run_path through ddprun's @record wrapper (the error file's traceback).
  const std::string entry = GENERATE(std::string("script"), "--run_path");
  std::map<std::string, std::string> tracebacks;
  for (const std::string mode : {"off", "always"}) {
    TempDir out;
    TempDir logs;
    const fs::path marker = out.path() / "marker";
    std::vector<std::string> argv = {bin_path("ddprun").string(), "--nproc_per_node=2",
                                     "--warm_start=" + mode, "--redirects=3",
                                     "--log_dir=" + logs.path().string()};
    if (entry != "script") argv.push_back(entry);
    argv.insert(argv.end(), {script("warm_job.py"), "raise", out.path().string()});
    const ProcessResult result =
        run_process(argv, {{"PYTHON_EXEC", torch_python()}, {"WARM_MARKER", marker.string()}}, {},
                    milliseconds(180000));
    INFO("entry " << entry << ", mode " << mode << "\nstderr:\n"
                  << result.err << "\nstdout:\n"
                  << result.out);
    if (entry == "--run_path") {  // the error file's traceback is the report's root cause
      CHECK_THAT(result.err,
                 Catch::Contains("ValueError: boom from rank 1") && Catch::Contains("error.json"));
    }
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
    "a worker forked from the warm template soon owns its pages alone, as an exec'd one does "
    "(the template takes the copies after the fork)",
    "[torch]") {
  if (!torch_available()) {
    return skip(torch_python() + " cannot import torch.distributed with Gloo");
  }
  const std::string mode = GENERATE(std::string("off"), "always");
  TempDir out;
  const ProcessResult result =
      // A restart to come: the template lives on beside the worker (else it ends once forked).
      run_process({bin_path("ddprun").string(), "--nproc_per_node=1", "--max_restarts=1",
                   "--warm_start=" + mode, script("warm_pages.py"), out.path().string()},
                  {{"PYTHON_EXEC", torch_python()}}, {}, milliseconds(120000));
  INFO("mode " << mode << "\nstderr:\n" << result.err << "\nstdout:\n" << result.out);
  REQUIRE(result.status == 0);
  if (mode == "always") {
    CHECK_THAT(result.err, Catch::Contains("warm start: attempt 0's 1 worker was forked"));
  }
  // The share of its anonymous resident pages it alone maps, once at least 0.9 (or after 30 s).
  CHECK(std::stod(read_file(out.path() / "share")) >= 0.9);
}

TEST_CASE(
    "a warm start that should not happen starts the workers cold with one line saying why, "
    "and the job succeeds (a preloaded module started a thread, changed on disk, or the "
    "template was killed)",
    "[torch]") {
  if (!torch_available()) {
    return skip(torch_python() + " cannot import torch.distributed with Gloo");
  }
  // The installed module each mode imports, which the test has the template preload.
  const auto [mode, why, preload] = GENERATE(table<std::string, std::string, std::string>({
      {"thread", "threads after its imports", "warm_thready"},
      {"changed", "changed since the template imported it", "warm_plain"},
      {"killed", "warm template was killed", "warm_plain"},
  }));
  TempDir out;
  TempDir logs;
  const fs::path site = copy_site(out.path());
  const ProcessResult result = run_process(
      {bin_path("ddprun").string(), "--nproc_per_node=2", "--max_restarts=1",
       "--warm_start=restart", "--warm_preload=" + preload, "--log_dir=" + logs.path().string(),
       script("warm_job.py"), mode, out.path().string()},
      {{"PYTHON_EXEC", torch_python()},
       {"PYTHONPATH", site.string()},
       {"WARM_MARKER", (out.path() / "marker").string()}},
      {}, milliseconds(180000));
  INFO("mode " << mode << "\nstderr:\n" << result.err << "\nstdout:\n" << result.out);
  CHECK(result.status == 0);
  CHECK_THAT(result.err, Catch::Contains("ddprun: warm start: ") && Catch::Contains(why));
  // One line says it (the docs' promise), whenever ddprun learnt it.
  std::size_t lines = 0;
  for (std::size_t at = result.err.find("ddprun: warm start: "); at != std::string::npos;
       at = result.err.find("ddprun: warm start: ", at + 1)) {
    ++lines;
  }
  if (mode == "killed") {  // replaced as soon as ddprun sees it gone: the restart is warm
    CHECK_THAT(result.err, Catch::Contains("the warm template was killed by signal 9); "
                                           "starting another"));
    CHECK_THAT(result.err, Catch::Contains("attempt 1's 2 workers were forked"));
    CHECK(lines == 2);
    // A forked worker writes its modules list too (for the template of a later restart), as
    // an exec'd one does.
    int forked_lists = 0;
    for (const auto& entry : fs::recursive_directory_iterator(logs.path())) {
      if (entry.path().filename() == "modules.txt" &&
          entry.path().string().find("/attempt_1/") != std::string::npos) {
        ++forked_lists;
      }
    }
    CHECK(forked_lists == 2);
  } else {
    CHECK(lines == 1);
  }
  CHECK_THAT(result.out,
             Catch::Contains("attempt 1 rank 0") && Catch::Contains("attempt 1 rank 1"));
}

TEST_CASE(
    "two agents each fork their restarted workers from their own warm template, with c10d and "
    "with static rendezvous",
    "[torch]") {
  if (!torch_available()) {
    return skip(torch_python() + " cannot import torch.distributed with Gloo");
  }
  const std::string backend = GENERATE(std::string("c10d"), "static");
  TempDir out;
  const int port = reserve_port();
  std::vector<std::unique_ptr<ChildProcess>> nodes;
  std::vector<std::unique_ptr<TempDir>> logs;
  for (int node = 0; node < 2; ++node) {
    logs.push_back(std::make_unique<TempDir>());
    std::vector<std::string> argv = {
        bin_path("ddprun").string(), "--nnodes=2",
        "--nproc_per_node=2",        "--max_restarts=1",
        "--warm_start=restart",      "--log_dir=" + logs.back()->path().string()};
    if (backend == "c10d") {
      argv.insert(argv.end(),
                  {"--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:" + std::to_string(port),
                   "--rdzv_id=warm"});
    } else {
      argv.insert(argv.end(), {"--node_rank=" + std::to_string(node), "--master_addr=127.0.0.1",
                               "--master_port=" + std::to_string(port)});
    }
    argv.insert(argv.end(), {script("warm_fields.py"), out.path().string(), "crash"});
    nodes.push_back(std::make_unique<ChildProcess>(
        argv, std::map<std::string, std::string>{{"PYTHON_EXEC", torch_python()}}));
  }
  INFO("rendezvous: " << backend);  // also when a wait throws
  for (auto& node : nodes) {
    const ProcessResult result = node->wait(milliseconds(180000));
    INFO("stderr:\n" << result.err << "\nstdout:\n" << result.out);
    CHECK(result.status == 0);
    CHECK_THAT(result.err, Catch::Contains("warm start: attempt 1's 2 workers were forked"));
  }
  for (int rank = 0; rank < 4; ++rank) {
    INFO("rank " << rank);
    CHECK(fs::exists(out.path() / ("a1_r" + std::to_string(rank) + ".json")));
  }
}

namespace {

// warm_job.py wait under ddprun --warm_start=always, 2 workers, both ready, with a restart to
// make (else the template goes once it forked them).
struct WaitingJob {
  TempDir out;
  TempDir logs;
  std::unique_ptr<ChildProcess> ddprun;
  std::vector<pid_t> workers;
  pid_t template_pid = 0;

  WaitingJob() {
    ddprun = std::make_unique<ChildProcess>(
        std::vector<std::string>{bin_path("ddprun").string(), "--nproc_per_node=2",
                                 "--max_restarts=1", "--warm_start=always",
                                 "--log_dir=" + logs.path().string(), script("warm_job.py"), "wait",
                                 out.path().string()},
        std::map<std::string, std::string>{{"PYTHON_EXEC", torch_python()},
                                           {"WARM_MARKER", (out.path() / "marker").string()}});
    for (const std::string& line :
         ddprun->wait_for_stdout_lines("ready ", 2, milliseconds(120000))) {
      workers.push_back(std::stoi(line.substr(line.find(' ') + 1)));
    }
    // The template: ddprun's child that runs _ddprun_template.py (the workers it forked show
    // its command line too).
    for (const auto& entry : fs::directory_iterator("/proc")) {
      const std::string cmdline = read_file(entry.path() / "cmdline");
      if (cmdline.find("_ddprun_template.py") == std::string::npos) continue;
      const std::string stat = read_file(entry.path() / "stat");
      std::istringstream fields(stat.substr(stat.rfind(')') + 2));
      std::string state;
      pid_t parent = 0;
      fields >> state >> parent;
      const pid_t pid = std::stoi(entry.path().filename().string());
      if (parent == ddprun->pid() &&
          std::find(workers.begin(), workers.end(), pid) == workers.end()) {
        template_pid = pid;
      }
    }
  }
  void go() { std::ofstream(out.path() / "go") << "go\n"; }
};

}  // namespace

TEST_CASE("kill -9 of ddprun leaves neither its warm template nor the workers it forked",
          "[torch]") {
  if (!torch_available()) {
    return skip(torch_python() + " cannot import torch.distributed with Gloo");
  }
  WaitingJob job;
  REQUIRE(job.workers.size() == 2);
  REQUIRE(job.template_pid > 0);
  job.ddprun->signal(SIGKILL);
  job.ddprun->wait(milliseconds(10000));
  for (const pid_t pid : {job.workers[0], job.workers[1], job.template_pid}) {
    INFO("pid " << pid);
    CHECK(wait_for_process_exit(pid, milliseconds(10000)));
  }
}

TEST_CASE(
    "kill -9 of the warm template leaves the workers it forked running, and the job ends as "
    "it would have",
    "[torch]") {
  if (!torch_available()) {
    return skip(torch_python() + " cannot import torch.distributed with Gloo");
  }
  WaitingJob job;
  REQUIRE(job.template_pid > 0);
  ::kill(job.template_pid, SIGKILL);
  CHECK(wait_for_process_exit(job.template_pid, milliseconds(10000)));
  job.go();
  const ProcessResult result = job.ddprun->wait(milliseconds(60000));
  INFO("stderr:\n" << result.err);
  CHECK(result.status == 0);
}

TEST_CASE("kill -USR1 of ddprun shows the stacks of workers forked from the warm template",
          "[torch]") {
  if (!torch_available()) {
    return skip(torch_python() + " cannot import torch.distributed with Gloo");
  }
  WaitingJob job;
  job.ddprun->signal(SIGUSR1);
  job.ddprun->wait_for_stderr("where each Python worker is:", milliseconds(20000));
  job.go();
  const ProcessResult result = job.ddprun->wait(milliseconds(60000));
  INFO("stderr:\n" << result.err);
  CHECK(result.status == 0);
  CHECK_THAT(result.err, Catch::Contains("warm_job.py"));
}

TEST_CASE(
    "no warm template where the workers cannot start again (one node, --max_restarts=0): no "
    "modules lists and no template, while with a restart to make the lists are written",
    "[torch]") {
  if (!torch_available()) {
    return skip(torch_python() + " cannot import torch.distributed with Gloo");
  }
  const auto [restarts, warm] = GENERATE(table<std::string, bool>({
      {"--max_restarts=0", false},  // torchrun's default: one round only
      {"--max_restarts=1", true},
  }));
  TempDir logs;
  const ProcessResult result = run_process(
      {bin_path("ddprun").string(), "--nproc_per_node=2", restarts, "--warm_start=restart",
       "--log_dir=" + logs.path().string(), script("torch_allreduce.py")},
      {{"PYTHON_EXEC", torch_python()}}, {}, milliseconds(120000));
  INFO(restarts << "\nstderr:\n" << result.err << "\nstdout:\n" << result.out);
  REQUIRE(result.status == 0);
  CHECK_THAT(result.err, !Catch::Contains("warm start"));
  int lists = 0;
  for (const auto& entry : fs::recursive_directory_iterator(logs.path())) {
    INFO("in the log folder: " << entry.path());
    if (!warm) CHECK(entry.path().filename() != "warm_template.log");
    if (entry.path().filename() == "modules.txt") ++lists;
  }
  // The probe writes each rank's list after its first collective (attempt 0's, for the
  // template of a restart) only where a template could use it.
  CHECK(lists == (warm ? 2 : 0));
}
