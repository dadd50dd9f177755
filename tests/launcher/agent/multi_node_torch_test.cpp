// A real PyTorch job (DDP_TEST_PYTHON's torch, Gloo, init_method="env://") across two agents on
// loopback, 2 nodes × 2 workers: ddprun gives the same all_reduce result as torchrun, with
// static and with c10d rendezvous; and after a worker's failure, each restarts and its next
// attempt all-reduces. Skipped, saying why, where torch cannot be imported.
#include <catch2/catch.hpp>
#include <map>

#include "multi_node_harness.hpp"
#include "skip.hpp"

using namespace ddp::test;

namespace {

constexpr milliseconds kTorchJobTimeout{180000};  // python + torch imports, twice, under load

// One node's command line: ddprun, or that PyTorch's torchrun (torchrun_argv()).
std::vector<std::string> node_command(const std::string& launcher, const std::string& backend,
                                      int node_rank, int port,
                                      const std::vector<std::string>& options,
                                      const std::vector<std::string>& script_args) {
  std::vector<std::string> argv;
  if (launcher == "ddprun") {
    argv = {bin_path("ddprun").string()};
  } else {
    argv = torchrun_argv();
  }
  argv.insert(argv.end(), {"--nnodes=2", "--nproc_per_node=2"});
  if (backend == "static") {
    argv.insert(argv.end(), {"--node_rank=" + std::to_string(node_rank), "--master_addr=127.0.0.1",
                             "--master_port=" + std::to_string(port)});
  } else {
    argv.insert(argv.end(),
                {"--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:" + std::to_string(port),
                 "--rdzv_id=torch-" + launcher});
  }
  argv.insert(argv.end(), options.begin(), options.end());
  argv.push_back(source_path("tests/launcher/agent/python/torch_allreduce.py").string());
  argv.insert(argv.end(), script_args.begin(), script_args.end());
  return argv;
}

// The "allreduce rank=R world=W sum=S" lines of both nodes, by rank. Each node's launcher
// gets `options`, the script `script_args`; each node must exit 0 and print `err_line` (when
// given) on stderr.
std::map<int, std::string> run_job(const std::string& launcher, const std::string& backend,
                                   const std::vector<std::string>& options = {},
                                   const std::vector<std::string>& script_args = {},
                                   const std::string& err_line = "") {
  const int port = reserve_port();
  const std::map<std::string, std::string> env = {{"PYTHON_EXEC", torch_python()}};
  ChildProcess node0(node_command(launcher, backend, 0, port, options, script_args), env);
  ChildProcess node1(node_command(launcher, backend, 1, port, options, script_args), env);
  std::map<int, std::string> lines;
  for (auto* node : {&node0, &node1}) {
    ProcessResult r = node->wait(kTorchJobTimeout);
    INFO(launcher << " " << backend << ":\n" << r.out << r.err);
    CHECK(r.status == 0);
    if (!err_line.empty()) CHECK_THAT(r.err, Catch::Contains(err_line));
    for (const std::string& line : lines_of(r.out)) {
      if (line.rfind("allreduce ", 0) == 0) lines[static_cast<int>(field_of(line, "rank"))] = line;
    }
  }
  return lines;
}

}  // namespace

TEST_CASE("PyTorch gloo on 2 nodes x 2 workers: ddprun's all_reduce matches torchrun's",
          "[torch]") {
  if (!torch_available()) {
    return skip(torch_python() + " cannot import torch.distributed with Gloo");
  }
  const std::string backend = GENERATE("static", "c10d");
  const auto under_torchrun = run_job("torchrun", backend);
  const auto under_ddprun = run_job("ddprun", backend);
  INFO(backend);
  // Ranks 0..3 of a world of 4, each reducing rank+1: 1+2+3+4.
  const std::map<int, std::string> expected = {{0, "allreduce rank=0 world=4 sum=10"},
                                               {1, "allreduce rank=1 world=4 sum=10"},
                                               {2, "allreduce rank=2 world=4 sum=10"},
                                               {3, "allreduce rank=3 world=4 sum=10"}};
  CHECK(under_torchrun == expected);
  CHECK(under_ddprun == expected);
}

TEST_CASE(
    "PyTorch gloo on 2 nodes x 2 workers: after a worker fails, each rendezvous restarts the "
    "job and attempt 1 all-reduces (static keeps MASTER_PORT: the last attempt's keys go)",
    "[torch]") {
  if (!torch_available()) {
    return skip(torch_python() + " cannot import torch.distributed with Gloo");
  }
  // Cold workers: the keys, not the warm template, are what this is about. PyTorch 2.x puts
  // no attempt in its keys, so a store that outlives attempt 0 would hand attempt 1's Gloo
  // attempt 0's addresses.
  const std::string backend = GENERATE("static", "c10d");
  const auto lines = run_job("ddprun", backend, {"--max_restarts=1", "--warm_start=off"},
                             {"fail_first"}, "restart 1 of at most 1");
  INFO(backend);
  const std::map<int, std::string> expected = {{0, "allreduce rank=0 world=4 sum=10 attempt=1"},
                                               {1, "allreduce rank=1 world=4 sum=10 attempt=1"},
                                               {2, "allreduce rank=2 world=4 sum=10 attempt=1"},
                                               {3, "allreduce rank=3 world=4 sum=10 attempt=1"}};
  CHECK(lines == expected);
}
