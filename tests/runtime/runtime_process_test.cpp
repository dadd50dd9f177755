// libddp over real processes on loopback: under ddprun, under an agent-hosted store, and
// under PyTorch's torchrun (DDP_TEST_PYTHON's: its agent store speaks 1.x on 1.13, 2.x on 2.x).
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <catch2/catch.hpp>
#include <regex>
#include <thread>

#include "ddp/store/server.hpp"
#include "skip.hpp"
#include "store_fixture.hpp"  // TestServer
#include "test_support.hpp"

namespace {

ddp::test::ShellResult run(const std::string& command) {
  return ddp::test::run_shell(command, 120);
}

std::size_t count_matches(const std::string& text, const std::string& pattern) {
  const std::regex re(pattern);
  return static_cast<std::size_t>(
      std::distance(std::sregex_iterator(text.begin(), text.end(), re), std::sregex_iterator()));
}

std::string bin(const std::string& name) { return ddp::test::bin_path(name).string(); }

// The env contract for rank r of 3 with the agent's store at port (as torchrun's static
// rendezvous sets it).
std::string agent_store_worker(int rank, std::uint16_t port, const std::string& program,
                               bool agent_store = true) {
  return "RANK=" + std::to_string(rank) + " LOCAL_RANK=" + std::to_string(rank) +
         " WORLD_SIZE=3 LOCAL_WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
         std::to_string(port) +
         " TORCHELASTIC_USE_AGENT_STORE=" + (agent_store ? "True" : "False") +
         " TORCHELASTIC_RESTART_COUNT=0 " + program;
}

}  // namespace

TEST_CASE("the sample program prints sum=3 on each of 3 ranks under ddprun") {
  const auto result = run(bin("ddprun") + " --nproc_per_node=3 " + bin("ddp-example-sum"));
  INFO(result.output);
  REQUIRE(result.status == 0);
  REQUIRE(count_matches(result.output, "rank=[012] world=3 sum=3\\b") == 3);
}

TEST_CASE("every collective and dtype over 3 Gloo processes under ddprun") {
  // All-reduce through shared memory (the default on one node), then over TCP.
  for (const std::string shm : {"1", "0"}) {
    const auto result = run("env DDP_BACKEND=gloo DDP_SHM=" + shm + " " + bin("ddprun") +
                            " --nproc_per_node=3 " + bin("ddp-runtime-worker") + " collectives");
    INFO("DDP_SHM=" << shm << "\n" << result.output);
    REQUIRE(result.status == 0);
    REQUIRE(count_matches(result.output, "ok rank=[012] world=3 backend=gloo") == 3);
  }
}

TEST_CASE("the Reducer equals one all-reduce over 3 processes under ddprun") {
  const auto result =
      run(bin("ddprun") + " --nproc_per_node=3 " + bin("ddp-runtime-worker") + " reducer");
  INFO(result.output);
  REQUIRE(result.status == 0);
  REQUIRE(count_matches(result.output, "ok rank=[012]") == 3);
}

TEST_CASE("ranks use the agent's store when TORCHELASTIC_USE_AGENT_STORE=True") {
  ddp::test::TestServer server;
  const auto port = server.port();
  const std::string program = bin("ddp-example-sum");
  const auto result = run("sh -c '" + agent_store_worker(0, port, program) + " & " +
                          agent_store_worker(1, port, program) + " & " +
                          agent_store_worker(2, port, program) + " & wait'");
  INFO(result.output);
  REQUIRE(count_matches(result.output, "sum=3\\b") == 3);
  REQUIRE(server.stats().keys > 0);  // the ranks met through this store, not one of their own
}

TEST_CASE("rank 0 hosts the store when the agent does not (TORCHELASTIC_USE_AGENT_STORE=False)") {
  const auto port = ddp::test::reserve_port();
  const std::string program = bin("ddp-example-sum");
  const auto result = run("sh -c '" + agent_store_worker(2, port, program, false) + " & " +
                          agent_store_worker(1, port, program, false) + " & " +
                          agent_store_worker(0, port, program, false) + " & wait'");
  INFO(result.output);
  REQUIRE(count_matches(result.output, "sum=3\\b") == 3);
}

TEST_CASE("the sample program works under PyTorch's torchrun (its own agent store)", "[torch]") {
  if (!ddp::test::torch_available()) {
    return ddp::test::skip(ddp::test::torch_python() + " cannot import torch");
  }
  // torchrun starts the program where its python runs: a PyTorch in another root (the 2.14
  // test root, Debian sid) may lack the libraries this build links (NCCL, Debian 12's Gloo).
  // (127: the loader could not start it; without ddprun's variables it stops itself.)
  const auto runs =
      run(ddp::test::torch_python() + " -c \"import subprocess, sys; r = subprocess.run(['" +
          bin("ddp-example-sum") + "'], capture_output=True, text=True); " +
          "print(r.stderr.strip() if r.returncode == 127 else ''); " +
          "sys.exit(r.returncode == 127)\" 2>&1");
  if (runs.status != 0) {
    return ddp::test::skip(
        "the system of " + ddp::test::torch_python() +
        " cannot run this build's programs, so neither can its torchrun: " + runs.output);
  }
  std::string torchrun;
  for (const std::string& arg : ddp::test::torchrun_argv()) torchrun += arg + " ";
  // Static rendezvous: the agent hosts its store (TORCHELASTIC_USE_AGENT_STORE=True), in the
  // dialect of its version; the workers find which one it speaks.
  const auto port = ddp::test::reserve_port();
  const auto result = run(torchrun + "--nproc_per_node=3 --master_port=" + std::to_string(port) +
                          " --no_python " + bin("ddp-example-sum"));
  INFO(result.output);
  REQUIRE(result.status == 0);
  REQUIRE(count_matches(result.output, "sum=3\\b") == 3);
}

TEST_CASE("the training-loop example converges with equal parameters on 3 ranks") {
  const auto result =
      run(bin("ddprun") + " --nproc_per_node=3 " + bin("ddp-example-train") + " --epochs 3");
  INFO(result.output);
  REQUIRE(result.status == 0);
  REQUIRE(result.output.find("[rank 0] parameters equal on all ranks: yes") != std::string::npos);
  std::smatch last;
  REQUIRE(std::regex_search(result.output, last, std::regex("\\[rank 0\\] epoch 2 loss (\\S+)")));
  REQUIRE(std::stod(last[1].str()) < 1e-2);  // from about 1 in epoch 0
}

TEST_CASE("a /dev/shm too small for the segment: the all-reduce falls back to TCP, no SIGBUS") {
  // A private mount namespace with a one-page /dev/shm (as a container's small default):
  // needs root and unshare; other processes keep the real /dev/shm.
  if (run("unshare -m true").status != 0) {
    return ddp::test::skip("cannot create a mount namespace here (needs root and unshare)");
  }
  const auto result = run("unshare -m sh -c 'mount -t tmpfs -o size=4k tmpfs /dev/shm && " +
                          bin("ddprun") + " --nproc_per_node=3 " + bin("ddp-example-sum") + "'");
  INFO(result.output);
  REQUIRE(result.status == 0);
  REQUIRE(count_matches(result.output, "rank=[012] world=3 sum=3\\b") == 3);
}
