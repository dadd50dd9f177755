// Context::abort on Gloo: ranks as threads over a MemoryStore, on loopback.
#include <catch2/catch.hpp>
#include <chrono>
#include <functional>
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

// Rank 0 starts `running` (which waits for rank 1, which never joins it) and queues an
// all-reduce behind it, then aborts: both fail at once with the reason, and so does every
// later call. Rank 1 leaves only once rank 0 saw all that, so nothing but the abort ends
// rank 0's wait (its timeout is 30 s).
void check_abort_ends_running(const std::function<ddp::Work(Context&)>& start_running,
                              bool shared_memory) {
  std::promise<void> seen, joined;
  std::shared_future<void> rank0_saw = seen.get_future().share();
  std::shared_future<void> rank1_joined = joined.get_future().share();
  ddp::InitOptions options;
  options.shared_memory = shared_memory;
  ddp::test::run_world(
      2,
      [&](Context& ctx) {
        if (ctx.rank() == 1) {
          joined.set_value();  // its side of the mesh is complete
          RANK_REQUIRE(rank0_saw.wait_for(std::chrono::seconds(60)) == std::future_status::ready);
          return;
        }
        RANK_REQUIRE(rank1_joined.wait_for(std::chrono::seconds(30)) == std::future_status::ready);
        ddp::Work running = start_running(ctx);
        std::vector<float> data(16, 1.0f);
        ddp::Work queued = ctx.allreduce_async(std::span<float>(data));
        const auto start = std::chrono::steady_clock::now();
        ctx.abort(kReason);
        ctx.abort("a second reason is ignored");
        const std::string queued_error = error_of([&] { queued.wait(std::chrono::seconds(20)); });
        const std::string running_error = error_of([&] { running.wait(std::chrono::seconds(20)); });
        const auto took = std::chrono::steady_clock::now() - start;
        seen.set_value();
        RANK_REQUIRE(queued_error.find(kReason) != std::string::npos);
        RANK_REQUIRE(queued_error.find("allreduce") != std::string::npos);
        RANK_REQUIRE(running_error.find(kReason) != std::string::npos);
        RANK_REQUIRE(took < std::chrono::seconds(10));  // not the 30 s timeout
        // Every later call fails with it, at the call.
        const std::string later = error_of([&] { ctx.allreduce(std::span<float>(data)); });
        RANK_REQUIRE(later.find(kReason) != std::string::npos);
        RANK_REQUIRE(later.find("a second reason") == std::string::npos);
        RANK_REQUIRE_THROWS_AS(ctx.barrier(), ddp::CommError);
      },
      options);
}

TEST_CASE(
    "gloo: abort fails the queued collectives, cuts short the running one, and fails "
    "later calls, with the reason") {
  std::vector<double> big(1 << 16, 1.0);
  SECTION("a barrier over TCP") {
    check_abort_ends_running([](Context& ctx) { return ctx.barrier_async(); }, true);
  }
  SECTION("an all-reduce through shared memory") {
    check_abort_ends_running(
        [&](Context& ctx) { return ctx.allreduce_async(std::span<double>(big)); }, true);
  }
  SECTION("an all-reduce over TCP") {
    check_abort_ends_running(
        [&](Context& ctx) { return ctx.allreduce_async(std::span<double>(big)); }, false);
  }
}

TEST_CASE("gloo: an abort fails the peer's collective with this rank at once") {
  ddp::InitOptions options;
  options.shared_memory = false;
  std::promise<void> waiting;
  std::shared_future<void> rank1_waiting = waiting.get_future().share();
  ddp::test::run_world(
      2,
      [&](Context& ctx) {
        std::vector<double> data(8, 1.0);
        if (ctx.rank() == 0) {
          RANK_REQUIRE(rank1_waiting.wait_for(std::chrono::seconds(30)) ==
                       std::future_status::ready);
          ctx.abort(kReason);
          return;
        }
        ddp::Work work = ctx.allreduce_async(std::span<double>(data));
        const auto start = std::chrono::steady_clock::now();
        waiting.set_value();
        const std::string error = error_of([&] { work.wait(std::chrono::seconds(20)); });
        RANK_REQUIRE(error.find("closed by peer") != std::string::npos);
        RANK_REQUIRE(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
      },
      options);
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
