// Context::abort on Gloo: ranks as threads over a MemoryStore, on loopback.
#include <catch2/catch.hpp>
#include <chrono>
#include <future>
#include <vector>

#include "ddp/runtime.hpp"
#include "thread_world.hpp"

using ddp::Context;

namespace {

constexpr const char* kReason = "operator stop: rank declared hung";

// What `f` throws, or "" when it returns.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("gloo: after abort, queued and later collectives fail with the reason") {
  std::promise<void> aborted;
  std::shared_future<void> rank0_aborted = aborted.get_future().share();
  ddp::test::run_world(2, [&](Context& ctx) {
    if (ctx.rank() == 1) {
      // Never joins rank 0's barrier; leaves (closing its connections) once rank 0 has seen
      // its queued work fail, so that rank 0's barrier ends long before its timeout.
      RANK_REQUIRE(rank0_aborted.wait_for(std::chrono::seconds(30)) == std::future_status::ready);
      return;
    }
    ddp::Work running = ctx.barrier_async();  // waits for rank 1, which never comes
    std::vector<float> data(16, 1.0f);
    ddp::Work queued = ctx.allreduce_async(std::span<float>(data));
    ctx.abort(kReason);
    ctx.abort("a second reason is ignored");
    // Queued behind the blocked barrier: fails at once (well within the 30 s timeout).
    const auto start = std::chrono::steady_clock::now();
    const std::string queued_error = error_of([&] { queued.wait(std::chrono::seconds(20)); });
    aborted.set_value();
    RANK_REQUIRE(queued_error.find(kReason) != std::string::npos);
    RANK_REQUIRE(queued_error.find("allreduce") != std::string::npos);
    RANK_REQUIRE(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
    // The running one fails with the reason too once it ends (when rank 1 leaves).
    const std::string running_error = error_of([&] { running.wait(std::chrono::seconds(20)); });
    RANK_REQUIRE(running_error.find(kReason) != std::string::npos);
    // Every later call fails with it, at the call.
    const std::string later = error_of([&] { ctx.allreduce(std::span<float>(data)); });
    RANK_REQUIRE(later.find(kReason) != std::string::npos);
    RANK_REQUIRE(later.find("a second reason") == std::string::npos);
    RANK_REQUIRE_THROWS_AS(ctx.barrier(), ddp::CommError);
  });
}

TEST_CASE("gloo: abort on a world of one fails the next call with the reason") {
  ddp::test::run_world(1, [](Context& ctx) {
    std::vector<double> data(4, 2.0);
    ctx.allreduce(std::span<double>(data));  // usable before
    ctx.abort(kReason);
    const std::string error = error_of([&] { ctx.broadcast(std::span<double>(data)); });
    RANK_REQUIRE(error.find(kReason) != std::string::npos);
    RANK_REQUIRE(error.find("broadcast") != std::string::npos);
  });
}
