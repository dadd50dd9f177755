// An interpreter that cannot load ddprun's probe (issue 36): found by asking a wrapper script
// for its sys.flags, and given torchrun's environment alone.
#include "process/python_isolation.hpp"

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <set>

#include "ddp/common/worker_contract.hpp"
#include "process/worker_environment.hpp"
#include "test_support.hpp"

using namespace ddp::launcher;
namespace fs = std::filesystem;

namespace {

// The command ddprun runs a script with, under `program`.
WorkerCommand python_command(const std::string& program) {
  WorkerCommand command;
  command.program = program;
  command.argv = {program, "-u", "train.py"};
  command.args_begin = 3;
  command.python = true;
  return command;
}

}  // namespace

TEST_CASE(
    "a wrapper that starts Python with -I, -E or -S is found isolated, and one with -s or no "
    "flag is not") {
  const auto [flags, found] = GENERATE(table<std::string, std::string>({
      {"-I", "-I"},
      {"-E", "-E"},
      {"-S", "-S"},
      {"-sE", "-E"},
      {"-s", ""},
      {"", ""},
  }));
  ddp::test::TempDir dir;
  const fs::path wrapper = dir.path() / "python";
  std::ofstream(wrapper) << "#!/bin/sh\necho a line of its own\nexec /usr/bin/python3 " << flags
                         << " \"$@\"\n";
  fs::permissions(wrapper, fs::perms::owner_all);
  INFO("python3 " << flags);
  CHECK(python_isolation_flag(python_command(wrapper.string())) == found);
}

TEST_CASE(
    "a binary interpreter, a failing wrapper and a program that is not Python are not asked") {
  CHECK(python_isolation_flag(python_command("/usr/bin/python3")).empty());
  CHECK(python_isolation_flag(python_command("/bin/false")).empty());
  WorkerCommand program = python_command("/bin/sh");
  program.python = false;
  CHECK(python_isolation_flag(program).empty());
}

TEST_CASE(
    "torchrun_only: torchrun's variables and the agent's, nothing of ddprun's (no probe, no "
    "Flight Recorder, no NCCL plugin, no store dialect, no record page), an outer ddprun's "
    "dropped") {
  NodeEnvironment node;
  node.base_env = {{"PATH", "/usr/bin"},
                   {std::string(ddp::contract::kRecordFd), "7"}};  // from an outer ddprun
  node.python = true;
  node.python_probe_dir = "/opt/ddprun/share/ddprun/python";
  node.stack_signal = 40;
  node.nccl_profiler = "/opt/ddprun/lib/libddprun-nccl-profiler.so";
  WorkerOwnVariables own{"DDPRUN_RECORD_FD=9", "DDPRUN_STACK_FD=10",
                         "DDPRUN_MODULES_FILE=/logs/modules.txt", "/logs/nccl_trace_rank_"};
  ddp::elastic::RoundInfo round;
  round.members.push_back({"n0", "h0", "", 1, "trainer"});
  const WorkerIdentity worker{0, 0, "/logs/error.json", ddp::elastic::worker_ranks(round, 0)};
  const MasterEndpoint master{"127.0.0.1", 29500, true};
  LaunchConfig config;
  for (const bool torchrun_only : {false, true}) {
    node.torchrun_only = torchrun_only;
    const std::vector<std::string> env = worker_environment(node, config, master, worker, own);
    std::set<std::string> names;
    for (const std::string& entry : env) names.insert(entry.substr(0, entry.find('=')));
    INFO("torchrun_only " << torchrun_only);
    CHECK(names.contains("RANK"));
    CHECK(names.contains("TORCHELASTIC_ERROR_FILE"));
    CHECK(names.contains("PATH"));
    for (const std::string name :
         {"PYTHONPATH", "DDPRUN_RECORD_FD", "DDPRUN_STACK_FD", "DDPRUN_STACK_SIGNAL",
          "DDPRUN_MODULES_FILE", "DDPRUN_FR_OLD_NAMES", "DDP_STORE_DIALECT",
          "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_BUFFER_SIZE", "NCCL_PROFILER_PLUGIN"}) {
      INFO(name);
      CHECK(names.contains(name) == !torchrun_only);
    }
  }
}
