// The agent hosts the job's store on MASTER_PORT: PyTorch ranks meet through it across
// restarts, and a port already in use stops ddprun before any worker starts.
#include <catch2/catch.hpp>

#include "process_harness.hpp"
#include "skip.hpp"
#include "test_support.hpp"

using namespace ddp::test;

TEST_CASE("a --master_port in use stops ddprun before any worker starts, naming the port") {
  SilentListener taken;  // on 127.0.0.1; the agent listens on every interface
  const std::string port = std::to_string(taken.port());
  ProcessResult r =
      run_process({bin_path("ddprun").string(), "--nproc_per_node=2", "--master_port=" + port,
                   bin_path("ddp-sample-worker").string(), "--print", "worker started"});
  INFO(r.err);
  CHECK(r.status == 1);
  CHECK_THAT(r.err, Catch::Contains(port));
  CHECK(r.out.find("worker started") == std::string::npos);
}

TEST_CASE("PyTorch: a restarted gloo group meets again through the agent's store, every time",
          "[torch]") {
  if (!torch_available()) {
    return ddp::test::skip(torch_python() + " cannot import torch with Gloo");
  }
  // PyTorch 2.x puts no attempt into its keys: attempt 1 meets only if the agent's store
  // forgot attempt 0's (torchrun 2.14 passed 5 of 13 such runs here). Several runs there, as it
  // failed by chance; 1.x's keys name the attempt, so one run says it all.
  const auto version = torch_version();
  const int runs = version && version->major >= 2 ? 5 : 1;
  for (int run = 0; run < runs; ++run) {
    ProcessResult r = run_process(
        {bin_path("ddprun").string(), "--standalone", "--nproc_per_node=2", "--max_restarts=1",
         source_path("tests/launcher/agent/python/torch_restart.py").string()},
        {{"PYTHON_EXEC", torch_python()}}, {}, std::chrono::seconds(120));
    INFO("run " << run << ":\n" << r.out << r.err);
    REQUIRE(r.status == 0);
    CHECK_THAT(r.out, Catch::Contains("attempt=1 rank=0 sum=3"));
    CHECK_THAT(r.out, Catch::Contains("attempt=1 rank=1 sum=3"));
  }
}
