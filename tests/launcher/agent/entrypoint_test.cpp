// ddprun with Python scripts, modules and direct programs, bad input on the real binary, and
// a real PyTorch (python3-torch, Gloo) job.
#include <catch2/catch.hpp>
#include <csignal>
#include <fstream>
#include <nlohmann/json.hpp>

#include "process_harness.hpp"
#include "skip.hpp"
#include "test_support.hpp"

using namespace ddp::test;
using nlohmann::json;

namespace {

std::string ddprun_path() { return bin_path("ddprun").string(); }
std::string python_dir() { return source_path("tests/launcher/agent/python").string(); }

// The "probe {...}" lines of ddp_probe.py, by rank.
std::map<int, json> probes(const std::string& out) {
  std::map<int, json> by_rank;
  for (const auto& line : lines_of(out)) {
    if (line.starts_with("probe ")) {
      json j = json::parse(line.substr(6));
      by_rank[std::stoi(j["env"]["RANK"].get<std::string>())] = j;
    }
  }
  return by_rank;
}

}  // namespace

TEST_CASE("a .py entrypoint runs under PYTHON_EXEC -u with its arguments") {
  ProcessResult r = run_process({ddprun_path(), "--nproc_per_node=2",
                                 python_dir() + "/ddp_probe.py", "--lr", "0.1", "--", "-x"},
                                {{"PYTHON_EXEC", "/usr/bin/python3"}});
  INFO(r.err);
  REQUIRE(r.status == 0);
  auto p = probes(r.out);
  REQUIRE(p.size() == 2);
  for (auto& [rank, j] : p) {
    CHECK(j["argv"] == json::array({"--lr", "0.1", "--", "-x"}));
    CHECK(j["executable"] == "/usr/bin/python3");
    CHECK(j["name"] == "__main__");
    CHECK(j["unbuffered"] == true);
    CHECK(j["env"]["LOCAL_RANK"] == std::to_string(rank));
  }
}

TEST_CASE("a module entrypoint runs under python3 -u -m and legacy local rank adds --local_rank") {
  ProcessResult r = run_process(
      {ddprun_path(), "--nproc_per_node=2", "-m", "--legacy-local-rank", "ddp_probe", "a"},
      {{"PYTHONPATH", python_dir()}});
  INFO(r.err);
  REQUIRE(r.status == 0);
  auto p = probes(r.out);
  REQUIRE(p.size() == 2);
  CHECK(p[1]["argv"] == json::array({"--local_rank=1", "a"}));
  CHECK(p[0]["argv"] == json::array({"--local_rank=0", "a"}));
  CHECK(p[0]["name"] == "__main__");
}

TEST_CASE("other programs and no_python entrypoints run directly") {
  ProcessResult direct = run_process(
      {ddprun_path(), "--nproc_per_node=2", bin_path("ddp-sample-worker").string(), "--hello"});
  CHECK(direct.status == 0);
  CHECK_THAT(direct.out, Catch::Contains("hello from rank 1 of 2"));

  TempDir dir;
  auto script = dir.path() / "job.py";
  std::ofstream(script) << "#!/bin/sh\necho \"shell rank $RANK\"\n";
  std::filesystem::permissions(script, std::filesystem::perms::owner_all);
  ProcessResult forced = run_process({ddprun_path(), "--no-python", script.string()});
  CHECK(forced.status == 0);
  CHECK(forced.out == "shell rank 0\n");
}

TEST_CASE("failures under --run_path and -m write the error file: the report has the traceback") {
  for (std::vector<std::string> mode : std::vector<std::vector<std::string>>{
           {"--run_path", python_dir() + "/fail_on_rank1.py"}, {"-m", "fail_on_rank1"}}) {
    INFO(mode[0]);
    TempDir dir;
    std::vector<std::string> argv = {ddprun_path(), "--nproc_per_node=2", "--log_dir",
                                     dir.path().string()};
    argv.insert(argv.end(), mode.begin(), mode.end());
    ProcessResult r = run_process(argv, {{"PYTHONPATH", python_dir()}});
    INFO(r.err);
    CHECK(r.status == 1);
    auto root = r.err.substr(std::min(r.err.find("Root Cause"), r.err.size()));
    CHECK_THAT(root, Catch::Contains("rank      : 1 (local_rank: 1)"));
    CHECK_THAT(root, Catch::Contains("error_file: " + dir.path().string()));
    CHECK_THAT(root, Catch::Contains("traceback : Traceback (most recent call last):"));
    CHECK_THAT(root, Catch::Contains("in give_up"));
    CHECK_THAT(root, Catch::Contains("message   : ValueError: rank one gave up"));
  }
}

TEST_CASE("the entrypoint rule: a Python shebang or a non-executable text file runs with Python") {
  TempDir dir;
  auto shebang = dir.path() / "train";
  std::ofstream(shebang)
      << "#!/usr/bin/env python3\nimport sys, os\n"
         "print('python', os.environ['RANK'], sys.stdout.write_through, sys.executable)\n";
  std::filesystem::permissions(shebang, std::filesystem::perms::owner_all);
  ProcessResult a =
      run_process({ddprun_path(), shebang.string()}, {{"PYTHON_EXEC", "/usr/bin/python3"}});
  INFO(a.err);
  CHECK(a.status == 0);
  CHECK(a.out == "python 0 True /usr/bin/python3\n");  // under PYTHON_EXEC -u
  auto plain = dir.path() / "job";
  std::ofstream(plain) << "print('plain')\n";
  ProcessResult b = run_process({ddprun_path(), plain.string()});
  INFO(b.err);
  CHECK(b.status == 0);
  CHECK(b.out == "plain\n");
}

TEST_CASE("bad input exits as torchrun with one line and starts nothing") {
  TempDir dir;
  // 2 where torchrun's argparse stops; 1 for what torchrun refuses once parsed.
  for (auto [status, args] : std::vector<std::pair<int, std::vector<std::string>>>{
           {1, {"--nnodes=3:2", "x"}},
           {1, {"--nproc_per_node=abc", "x"}},
           {1, {"-m", "--no_python", "x"}},
           {2, {"--bogus", "x"}},
           {2, {}},
           {2, {"--max_restarts", "abc", "x"}},
           {1, {"--nnodes=2", "x"}},
           {1, {"--log_dir", dir.path().string(), "/no/such/train.py"}},
           {1, {"--log_dir", dir.path().string(), "no-such-program-on-path"}},
           {1, {"--log_dir", dir.path().string(), "/no/such/program"}},
       }) {
    args.insert(args.begin(), ddprun_path());
    INFO(Catch::Detail::stringify(args));
    ProcessResult r = run_process(args);
    CHECK(r.status == status);
    CHECK(lines_of(r.err).size() == 1);
    CHECK_THAT(r.err, Catch::StartsWith("ddprun: error: "));
    CHECK(r.out.empty());
  }
  CHECK(std::filesystem::is_empty(dir.path()));  // no worker (nor its log dir) was started
}

TEST_CASE("a program the kernel cannot execute: exit 1 naming it and the reason") {
  TempDir dir;
  auto program = dir.path() / "no-shebang";
  std::ofstream(program) << "echo hi\n";
  std::filesystem::permissions(program, std::filesystem::perms::owner_all);
  ProcessResult r = run_process({ddprun_path(), "--nproc_per_node=2", program.string()});
  CHECK(r.status == 1);
  CHECK_THAT(r.err, Catch::Contains("cannot execute " + program.string() + ": Exec format error"));
}

TEST_CASE("ddprun started with its standard streams closed gives workers /dev/null, not its own") {
  TempDir dir;
  // The worker says what its fd 0 is; its stdout goes to a log file (ddprun's is closed).
  ShellResult r = run_shell("exec " + ddprun_path() + " -r1 --log_dir " + dir.path().string() +
                                " /bin/sh -c 'readlink /proc/self/fd/0' 0<&- 1>&- 2>&-",
                            60);
  CHECK(r.status == 0);
  std::string out;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir.path())) {
    if (entry.path().filename() == "stdout.log") {
      std::ifstream in(entry.path());
      out.assign(std::istreambuf_iterator<char>(in), {});
    }
  }
  CHECK(out == "/dev/null\n");
}

TEST_CASE("the soft open-file limit is raised to the hard limit") {
  ShellResult hard = run_shell("ulimit -Hn", 10);
  if (hard.output.starts_with("unlimited") || std::stol(hard.output) < 2048) {
    return ddp::test::skip("the hard open-file limit here is " + hard.output +
                           " (the test needs one of 2048 or more it can raise to)");
  }
  // 200 teed workers need more than 256 descriptors: only with the raised limit does it run.
  ShellResult r = run_shell("ulimit -Sn 256 && " + ddprun_path() +
                                " --nproc_per_node=200 --tee=3 --local_ranks_filter=0 " +
                                bin_path("ddp-sample-worker").string() + " --hello",
                            120);
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK_THAT(r.output, Catch::Contains("hello from rank 0 of 200"));
}

TEST_CASE("out of descriptors: the error says how many workers and descriptors were needed") {
  if (sanitized_build()) {
    // The sanitizer runtimes open files of their own (to report, to read /proc/self/maps):
    // at the descriptor limit they fail in their own way ("invalid vptr", "memory cannot be
    // printed"), which says nothing about ddprun.
    return ddp::test::skip("under sanitizers: their runtimes need descriptors at the limit too");
  }
  ShellResult r = run_shell("ulimit -n 64 && " + ddprun_path() +
                                " --nproc_per_node=100 --tee=3 --local_ranks_filter=0 " +
                                bin_path("ddp-sample-worker").string() + " --hello",
                            120);
  INFO(r.output);
  CHECK(r.status == 1);
  CHECK_THAT(r.output, Catch::Contains("out of file descriptors starting 100 workers"));
  CHECK_THAT(r.output, Catch::Contains("the job needs about 832 descriptors and the limit is 64"));
}

TEST_CASE("help and version exit 0") {
  ProcessResult help = run_process({ddprun_path(), "--help"});
  CHECK(help.status == 0);
  CHECK_THAT(help.out, Catch::StartsWith("usage: ddprun"));
  ProcessResult version = run_process({ddprun_path(), "--version"});
  CHECK(version.status == 0);
  CHECK_THAT(version.out, Catch::StartsWith("ddprun "));
}

TEST_CASE("PyTorch: two ranks init_process_group(gloo) and all_reduce under ddprun", "[torch]") {
  if (!torch_available()) {
    return ddp::test::skip(torch_python() + " cannot import torch with Gloo");
  }
  ProcessResult r = run_process(
      {ddprun_path(), "--standalone", "--nproc_per_node=2", python_dir() + "/torch_allreduce.py"},
      {{"PYTHON_EXEC", torch_python()}}, {}, std::chrono::seconds(120));
  INFO(r.out << r.err);
  CHECK(r.status == 0);
  CHECK_THAT(r.out, Catch::Contains("allreduce rank=0 world=2 sum=3"));
  CHECK_THAT(r.out, Catch::Contains("allreduce rank=1 world=2 sum=3"));
}

TEST_CASE("PyTorch: @record's error file becomes the report's root cause", "[torch][sanitize]") {
  if (!torch_available()) {
    return ddp::test::skip(torch_python() + " cannot import torch");
  }
  TempDir dir;
  ProcessResult r = run_process({ddprun_path(), "--nproc_per_node=2", "--log_dir",
                                 dir.path().string(), python_dir() + "/torch_record_error.py"},
                                {{"PYTHON_EXEC", torch_python()}}, {}, std::chrono::seconds(120));
  CHECK(r.status == 1);
  INFO(r.err);
  auto root = r.err.substr(r.err.find("Root Cause"));
  CHECK_THAT(root, Catch::Contains("rank      : 1 (local_rank: 1)"));
  CHECK_THAT(root, Catch::Contains("message   : ValueError: rank one gave up"));
  CHECK_THAT(root, Catch::Contains("raise ValueError(\"rank one gave up\")"));
}

namespace {

// module_view.py's "view" line, and the traceback its failure printed (from "Traceback" to
// the exception's line), of `argv` then `entry` (-m module_view, or the script) run in the
// folder of the test scripts.
struct ModuleView {
  json view;
  std::vector<std::string> traceback;
};

ModuleView module_view(std::vector<std::string> argv, const std::vector<std::string>& entry,
                       const std::string& chdir_to) {
  argv.insert(argv.begin(), {"/bin/sh", "-c", "cd \"$0\" && exec \"$@\"", python_dir()});
  argv.insert(argv.end(), entry.begin(), entry.end());
  argv.insert(argv.end(), {chdir_to, "fail"});
  ProcessResult r =
      run_process(argv, {{"PYTHON_EXEC", torch_python()}}, {}, std::chrono::milliseconds(180000));
  INFO(r.err);
  CHECK(r.status == 1);
  ModuleView result;
  for (const auto& line : lines_of(r.out)) {
    if (line.starts_with("view ")) result.view = json::parse(line.substr(5));
  }
  bool in = false;
  for (const auto& line : lines_of(r.err)) {
    in = in || line == "Traceback (most recent call last):";
    if (in) result.traceback.push_back(line);
    if (in && line.starts_with("ValueError")) break;
  }
  REQUIRE(result.view.is_object());
  return result;
}

// Whether torch_python() can run a worker forked from a thread with no Python frame
// (_ddprun_frameless.works(), as the template asks it).
bool frameless_here() {
  const std::string folder =
      (bin_path("ddprun").parent_path().parent_path() / "share" / "ddprun" / "python").string();
  ProcessResult r =
      run_process({torch_python(), "-c",
                   "import sys; sys.path.insert(0, sys.argv[1]); import _ddprun_frameless as f; "
                   "print(f.works())",
                   folder},
                  {}, {}, std::chrono::milliseconds(60000));
  INFO(r.err);
  REQUIRE(r.status == 0);
  return r.out == "True\n";
}

// What a worker of `entry` sees under ddprun, cold and warm, against what torchrun runs:
// PYTHON_EXEC -u ENTRY ARGS. A warm worker has no frame of the template's beneath its own: the
// interpreter can finalize a child forked from a thread (3.11 as it is, 3.13 and later once the
// child adopted the main thread's state), and the template's log says so. (An interpreter
// where it cannot would keep exactly the template's two frames: that fails here.)
void check_view_as_python(const std::vector<std::string>& entry) {
  const bool frameless = frameless_here();
  CHECK(frameless);
  TempDir dir;
  const ModuleView python = module_view({torch_python(), "-u"}, entry, dir.path().string());
  REQUIRE(python.traceback.size() > 2);
  for (const std::string warm : {"off", "always"}) {
    INFO("--warm_start=" << warm);
    TempDir logs;
    const ModuleView ddprun =
        module_view({ddprun_path(), "--nproc_per_node=1", "--warm_start=" + warm,
                     "--log_dir=" + logs.path().string()},
                    entry, dir.path().string());
    CHECK(ddprun.view["warm"] == (warm == "always"));
    CHECK(ddprun.view["path0"] == python.view["path0"]);
    CHECK(ddprun.view["argv"] == python.view["argv"]);
    CHECK(ddprun.traceback == python.traceback);
    json stack = ddprun.view["stack"];
    std::string template_log;
    for (const auto& file : std::filesystem::recursive_directory_iterator(logs.path())) {
      if (file.path().filename() == "warm_template.log") template_log = read_file(file.path());
    }
    INFO(template_log);
    if (warm == "always") {
      CHECK((template_log.find("with no frame of the template's beneath") != std::string::npos) ==
            frameless);
    }
    if (warm == "always" && !frameless) {
      REQUIRE(stack.size() >= 2);
      for (int i = 0; i < 2; ++i) {
        CHECK_THAT(stack[0][0].get<std::string>(), Catch::EndsWith("/_ddprun_template.py"));
        stack.erase(0);
      }
    }
    CHECK(stack == python.view["stack"]);
  }
}

}  // namespace

TEST_CASE("a -m worker sees and prints what python -m shows it cold and warm", "[torch]") {
  // [torch]: run against both peers' interpreters (3.11, 3.14); skipped where that Python
  // has no PyTorch (CI without the 2.14 root), as every [torch] case is.
  if (!torch_available()) return skip(torch_python() + " cannot import torch.distributed");
  check_view_as_python({"-m", "module_view"});
}

TEST_CASE("a script worker's stack and traceback are python's cold and warm", "[torch]") {
  // [torch]: run against both peers' interpreters (3.11, 3.14); skipped where that Python
  // has no PyTorch (CI without the 2.14 root), as every [torch] case is.
  if (!torch_available()) return skip(torch_python() + " cannot import torch.distributed");
  check_view_as_python({python_dir() + "/module_view.py"});
}
