// NcclCommState's locking, without a GPU (issue 24): an abort must never wait for anything a
// stuck collective holds. The issuing thread takes the communicator's mutex only around its
// NCCL calls (with_comm), never across a CUDA call that can block behind a stuck kernel; an
// abort waits only for an NCCL call in progress, and a call after it never reaches NCCL.
// (The communicator is never built here: `comm` stays null, so no NCCL function runs.)
#include "nccl_comm_state.hpp"

#include <catch2/catch.hpp>
#include <chrono>
#include <future>
#include <thread>

#include "ddp/types.hpp"

using ddp::detail::NcclCommState;
using std::chrono::seconds;

TEST_CASE("nccl state: an abort does not wait for the issuing thread between NCCL calls") {
  NcclCommState state;
  std::promise<void> in_cuda, stuck_ends;
  auto in_cuda_future = in_cuda.get_future();
  std::shared_future<void> unstick = stuck_ends.get_future().share();
  // The issuing thread: one NCCL call, then "a CUDA copy stuck behind a kernel", then the
  // next NCCL call, as launch() does.
  auto issuer = std::async(std::launch::async, [&] {
    state.with_comm("first", [](ncclComm_t) { return 0; });
    in_cuda.set_value();
    unstick.wait_for(seconds(60));  // stands for cudaMemcpyAsync on a full stream
    return state.with_comm("second", [](ncclComm_t) { return 1; });
  });
  REQUIRE(in_cuda_future.wait_for(seconds(30)) == std::future_status::ready);
  auto aborter = std::async(std::launch::async, [&] { state.abort("watchdog: timeout"); });
  const bool abort_returned = aborter.wait_for(seconds(30)) == std::future_status::ready;
  stuck_ends.set_value();  // the stuck kernel ends (ncclCommAbort would have ended it)
  CHECK(abort_returned);
  CHECK(state.aborting());
  REQUIRE(issuer.wait_for(seconds(30)) == std::future_status::ready);
  // The next NCCL call never runs: it throws the abort's reason.
  CHECK_THROWS_WITH(issuer.get(), Catch::Contains("watchdog: timeout"));
}

TEST_CASE("nccl state: an abort waits for an NCCL call in progress, never runs beside it") {
  NcclCommState state;
  std::promise<void> inside, leave;
  auto inside_future = inside.get_future();
  std::shared_future<void> may_leave = leave.get_future().share();
  auto issuer = std::async(std::launch::async, [&] {
    state.with_comm("allreduce", [&](ncclComm_t) {
      inside.set_value();
      may_leave.wait_for(seconds(60));
      return 0;
    });
  });
  REQUIRE(inside_future.wait_for(seconds(30)) == std::future_status::ready);
  auto aborter = std::async(std::launch::async, [&] { state.abort("stop"); });
  // The reason is set at once (waiters fail now) while ncclCommAbort waits for the call.
  const auto start = std::chrono::steady_clock::now();
  while (!state.aborting() && std::chrono::steady_clock::now() - start < seconds(30)) {
    std::this_thread::yield();
  }
  CHECK(state.aborting());
  CHECK(state.aborted_because() == "stop");
  CHECK(aborter.wait_for(std::chrono::milliseconds(0)) == std::future_status::timeout);
  leave.set_value();
  CHECK(aborter.wait_for(seconds(30)) == std::future_status::ready);
  CHECK(issuer.wait_for(seconds(30)) == std::future_status::ready);
}
