// ddprun's Python probe does no harm in a worker (issue 28): the stack signal is sent only to a
// worker that still handles it with the stack file ddprun gave it, a stack dump never lands in
// the program's own files, and the worker and its children see the PYTHONPATH the user gave,
// exactly; a Python that cannot load the probe (isolated, issue 36) gets nothing of ddprun's.
// Python workers run with the Python of DDP_TEST_PYTHON, so that each case runs against both
// interpreters.

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
namespace fs = std::filesystem;

namespace {

std::string script(const std::string& name) {
  return source_path("tests/launcher/agent/python/" + name).string();
}

// stack_file_safety.py <mode> under ddprun with two workers: once both are set up,
// kill -USR1 <ddprun>; once ddprun printed the stacks, the workers may finish.
ProcessResult usr1_after(const std::string& mode, const fs::path& folder) {
  TempDir logs;
  ChildProcess job(
      {bin_path("ddprun").string(), "--nproc_per_node=2", "--log_dir=" + logs.path().string(),
       script("stack_file_safety.py"), mode, folder.string()},
      {{"PYTHON_EXEC", torch_python()}});
  job.wait_for_stdout_lines("ready rank", 2, milliseconds(60000));
  job.signal(SIGUSR1);
  job.wait_for_stderr("where each Python worker is:", milliseconds(20000));
  std::ofstream(folder / "go") << "go\n";
  return job.wait(milliseconds(60000));
}

}  // namespace

TEST_CASE(
    "kill -USR1 sends no stack signal to a worker that re-exec'd Python or took the signal "
    "back: both go on and exit 0",
    "[torch]") {
  if (!torch_available()) {
    return skip(torch_python() + " cannot import torch.distributed with Gloo");
  }
  TempDir folder;
  const ProcessResult result = usr1_after("handler", folder.path());
  INFO("stderr:\n" << result.err << "\nstdout:\n" << result.out);
  CHECK(result.status == 0);
  CHECK_THAT(result.out, Catch::Contains("done rank 0") && Catch::Contains("done rank 1"));
  CHECK_THAT(result.err, Catch::Contains("rank 0: no stack: it no longer handles"));
  CHECK_THAT(result.err, Catch::Contains("rank 1: no stack: it no longer handles"));
  CHECK_THAT(result.err, !Catch::Contains("FAILED"));
}

TEST_CASE(
    "kill -USR1 never writes a stack into the program's own file: not after it closed its "
    "descriptors and reopened the stack file's number, nor onto the descriptor the probe "
    "registered",
    "[torch]") {
  if (!torch_available()) {
    return skip(torch_python() + " cannot import torch.distributed with Gloo");
  }
  TempDir folder;
  const ProcessResult result = usr1_after("reuse", folder.path());
  INFO("stderr:\n" << result.err << "\nstdout:\n" << result.out);
  CHECK(result.status == 0);
  CHECK(read_file(folder.path() / "checkpoint0") == "checkpoint\n");
  CHECK(read_file(folder.path() / "checkpoint1") == "checkpoint\n");
  // Rank 0's probe keeps its stack file out of the program's reach: its stack is taken.
  CHECK_THAT(result.err, Catch::Contains("1 rank (rank 0): in ") &&
                             Catch::Contains("stack_file_safety.py\", line ") &&
                             !Catch::Contains("rank 0: no stack"));
  // Rank 1 put its checkpoint on the very descriptor: ddprun sees it is not its file.
  CHECK_THAT(result.err,
             Catch::Contains("rank 1: no stack: its stack file is no longer the one ddprun gave"));
}

TEST_CASE("kill -USR1 takes the stack of a worker that left the probe's set-up alone", "[torch]") {
  if (!torch_available()) {
    return skip(torch_python() + " cannot import torch.distributed with Gloo");
  }
  TempDir folder;
  const ProcessResult result = usr1_after("plain", folder.path());
  INFO("stderr:\n" << result.err << "\nstdout:\n" << result.out);
  CHECK(result.status == 0);
  // Each rank's stack (the two may differ by a frame: the signal follows "ready" closely).
  CHECK_THAT(result.err, Catch::Contains("in wait_for_go") && !Catch::Contains("no stack"));
}

TEST_CASE(
    "ddprun installed under a group-writable folder loads neither its Python probe nor its NCCL "
    "plugin, says so in one line each, and the job runs",
    "[torch]") {
  if (!torch_available()) {
    return skip(torch_python() + " cannot import torch.distributed with Gloo");
  }
  // A copy of the installation: <temp>/shared/prefix/{bin/ddprun, share/ddprun/python, lib}.
  TempDir dir;
  const fs::path shared = dir.path() / "shared", prefix = shared / "prefix";
  fs::create_directories(prefix / "bin");
  fs::create_directories(prefix / "lib");
  fs::copy(bin_path("ddprun"), prefix / "bin" / "ddprun");
  fs::copy(bin_path("ddprun").parent_path().parent_path() / "share", prefix / "share",
           fs::copy_options::recursive);
  const fs::path plugin =
      bin_path("ddprun").parent_path().parent_path() / "lib" / "libddprun-nccl-profiler.so";
  if (fs::exists(plugin)) fs::copy(plugin, prefix / "lib" / plugin.filename());
  fs::permissions(dir.path(), fs::perms(0755));
  fs::permissions(shared, fs::perms(0775));  // a shared project folder
  TempDir logs;
  const ProcessResult result =
      run_process({(prefix / "bin" / "ddprun").string(), "--nproc_per_node=1",
                   "--log_dir=" + logs.path().string(), script("python_path_report.py")},
                  {{"PYTHON_EXEC", torch_python()}}, {"PYTHONPATH"}, milliseconds(60000));
  INFO("stderr:\n" << result.err << "\nstdout:\n" << result.out);
  CHECK(result.status == 0);
  const std::string why = shared.string() + " is writable by its group";
  CHECK_THAT(result.err, Catch::Contains("ddprun: the Python probe is off: " + why));
  CHECK_THAT(result.err, Catch::Contains("(chmod g-w " + shared.string() + ")"));
  if (fs::exists(plugin)) {
    CHECK_THAT(result.err, Catch::Contains("ddprun: the NCCL profiler plugin is off: " + why));
  }
  // The worker ran without the probe: nothing of ddprun's on its PYTHONPATH.
  CHECK_THAT(result.out, Catch::Contains("paths {\"pythonpath\": null"));
  CHECK_THAT(result.out, !Catch::Contains(prefix.string()));
}

TEST_CASE(
    "a Python worker and its children see the PYTHONPATH they see under a plain python: "
    "unset, empty, \":\", \"a:b\"",
    "[torch]") {
  if (!torch_available()) {
    return skip(torch_python() + " cannot import torch.distributed with Gloo");
  }
  auto paths_of = [](const std::string& output) {
    const auto at = output.find("paths {");
    REQUIRE(at != std::string::npos);
    const auto end = output.find('\n', at);
    return nlohmann::json::parse(output.substr(at + 6, end - at - 6));
  };
  for (const char* value : {"<unset>", "", ":", "a:b"}) {
    const bool unset = std::string(value) == "<unset>";
    std::map<std::string, std::string> env;
    std::vector<std::string> drop;
    if (unset) {
      drop.push_back("PYTHONPATH");
    } else {
      env["PYTHONPATH"] = value;
    }
    const ProcessResult plain =
        run_process({torch_python(), script("python_path_report.py")}, env, drop);
    TempDir logs;
    env["PYTHON_EXEC"] = torch_python();
    const ProcessResult under_ddprun =
        run_process({bin_path("ddprun").string(), "--nproc_per_node=1",
                     "--log_dir=" + logs.path().string(), script("python_path_report.py")},
                    env, drop, milliseconds(60000));
    INFO("PYTHONPATH " << value << "\nplain:\n"
                       << plain.out << plain.err << "\nunder ddprun:\n"
                       << under_ddprun.out << under_ddprun.err);
    REQUIRE(plain.status == 0);
    REQUIRE(under_ddprun.status == 0);
    const nlohmann::json expected = paths_of(plain.out);
    const nlohmann::json seen = paths_of(under_ddprun.out);
    CHECK(seen["pythonpath"] == expected["pythonpath"]);
    CHECK(seen["sys_path"] == expected["sys_path"]);
    CHECK(seen["child"] == expected["child"]);
  }
}

namespace {

// The `isolated {json}` line of each rank (or of a plain run) that isolated_report.py printed.
std::vector<nlohmann::json> isolated_reports(const std::string& output) {
  std::vector<nlohmann::json> reports;
  for (std::size_t at = output.find("isolated {"); at != std::string::npos;
       at = output.find("isolated {", at + 1)) {
    const auto end = output.find('\n', at);
    reports.push_back(nlohmann::json::parse(output.substr(at + 9, end - at - 9)));
  }
  return reports;
}

}  // namespace

TEST_CASE(
    "a PYTHON_EXEC that starts Python isolated (-I), ignoring PYTHON* (-E) or without site (-S) "
    "gets torchrun's environment alone, and one line says what is off (warm starts too)",
    "[torch]") {
  if (!torch_available()) {
    return skip(torch_python() + " cannot import torch.distributed with Gloo");
  }
  const auto [flag, options] = GENERATE(table<std::string, std::string>({
      {"-I", "--warm_start=always"},   // the template would fork the first attempt
      {"-E", "--warm_start=restart"},  // the template would fork restarts
      {"-S", ""},                      // warm starts are off (auto): nothing to say of them
  }));
  TempDir dir;
  const fs::path wrapper = dir.path() / "python-isolated";
  std::ofstream(wrapper) << "#!/bin/sh\nexec '" << torch_python() << "' " << flag << " \"$@\"\n";
  fs::permissions(wrapper, fs::perms::owner_all);
  // What the same interpreter sees outside ddprun: the names and descriptors it has anyway.
  const ProcessResult plain = run_process({wrapper.string(), script("isolated_report.py")},
                                          {{"PYTHON_EXEC", wrapper.string()}});
  INFO("flag " << flag << "\nplain:\n" << plain.out << plain.err);
  REQUIRE(plain.status == 0);
  const nlohmann::json baseline = isolated_reports(plain.out).at(0);
  TempDir logs;
  std::vector<std::string> argv = {bin_path("ddprun").string(), "--nproc_per_node=2",
                                   "--log_dir=" + logs.path().string()};
  if (!options.empty()) argv.push_back(options);
  argv.push_back(script("isolated_report.py"));
  const ProcessResult result =
      run_process(argv, {{"PYTHON_EXEC", wrapper.string()}}, {}, milliseconds(120000));
  INFO("stderr:\n" << result.err << "\nstdout:\n" << result.out);
  REQUIRE(result.status == 0);
  // One line, naming the flag and the warm starts that are off (where they were asked for).
  const std::string line = "ddprun: the workers' interpreter (" + wrapper.string() + ") ";
  CHECK_THAT(result.err, Catch::Contains(line) && Catch::Contains("(" + flag + ")"));
  if (options.empty()) {
    CHECK_THAT(result.err, !Catch::Contains("warm starts"));
  } else {
    CHECK_THAT(result.err, Catch::Contains("no warm starts (every worker is exec'd)"));
  }
  CHECK(result.err.find(line) == result.err.rfind(line));
  CHECK_THAT(result.err, !Catch::Contains("deprecated"));  // PyTorch 2.14, both FR names set
  // torchrun's contract, and nothing else of ddprun's: no PYTHONPATH, no DDPRUN_*, no
  // DDP_STORE_DIALECT, no Flight Recorder or NCCL plugin variables, no descriptor.
  const std::set<std::string> contract = {"RANK",
                                          "LOCAL_RANK",
                                          "WORLD_SIZE",
                                          "LOCAL_WORLD_SIZE",
                                          "GROUP_RANK",
                                          "GROUP_WORLD_SIZE",
                                          "ROLE_RANK",
                                          "ROLE_NAME",
                                          "ROLE_WORLD_SIZE",
                                          "MASTER_ADDR",
                                          "MASTER_PORT",
                                          "TORCHELASTIC_RESTART_COUNT",
                                          "TORCHELASTIC_MAX_RESTARTS",
                                          "TORCHELASTIC_RUN_ID",
                                          "TORCHELASTIC_USE_AGENT_STORE",
                                          "TORCHELASTIC_ERROR_FILE",
                                          "TORCH_NCCL_ASYNC_ERROR_HANDLING",
                                          "TORCHELASTIC_SIGNALS_TO_HANDLE",
                                          "OMP_NUM_THREADS"};
  const std::set<std::string> had = baseline["names"].get<std::set<std::string>>();
  const std::set<int> open = baseline["descriptors"].get<std::set<int>>();
  const std::vector<nlohmann::json> ranks = isolated_reports(result.out);
  REQUIRE(ranks.size() == 2);
  for (const nlohmann::json& rank : ranks) {
    for (const std::string& name : rank["names"].get<std::vector<std::string>>()) {
      INFO("a worker's variable " << name);
      CHECK((had.contains(name) || contract.contains(name)));
    }
    for (const int fd : rank["descriptors"].get<std::vector<int>>()) {
      INFO("a worker's descriptor " << fd);
      CHECK(open.contains(fd));
    }
    CHECK(rank["flags"] == baseline["flags"]);
    CHECK(rank["child_modules"] == "[]");  // a plain Python child loads nothing of ddprun's
  }
  for (const auto& entry : fs::recursive_directory_iterator(logs.path())) {
    INFO("in the log folder: " << entry.path());
    CHECK(entry.path().filename() != "warm_template.log");
    CHECK(entry.path().filename() != "modules.txt");
  }
}
