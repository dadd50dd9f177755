#include "ddp/rank_zero_first.hpp"

#include <atomic>
#include <catch2/catch.hpp>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "test_support.hpp"
#include "thread_world.hpp"

TEST_CASE("rank_zero_first: rank 0 finishes the block before any other rank starts it") {
  std::atomic<bool> rank0_done{false};
  std::atomic<int> ran{0};
  ddp::test::run_world(3, [&](ddp::Context& ctx) {
    ddp::rank_zero_first(ctx, [&] {
      if (ctx.rank() == 0)
        rank0_done = true;
      else
        RANK_REQUIRE(rank0_done.load());
      ran.fetch_add(1);
    });
  });
  REQUIRE(ran.load() == 3);
}

TEST_CASE("rank_zero_first: a failure on rank 0 stops the others instead of hanging them") {
  std::atomic<int> others_failed{0};
  std::atomic<int> others_ran{0};
  ddp::test::run_world(3, [&](ddp::Context& ctx) {
    try {
      ddp::rank_zero_first(ctx, [&] {
        if (ctx.rank() == 0) throw std::runtime_error("download failed");
        others_ran.fetch_add(1);
      });
    } catch (const ddp::CommError& e) {
      RANK_REQUIRE(std::string(e.what()).find("failed on rank 0") != std::string::npos);
      others_failed.fetch_add(1);
    } catch (const std::runtime_error& e) {
      RANK_REQUIRE(ctx.rank() == 0);
      RANK_REQUIRE(std::string(e.what()) == "download failed");
    }
  });
  REQUIRE(others_failed.load() == 2);
  REQUIRE(others_ran.load() == 0);
}

TEST_CASE(
    "rank_zero_first: a block longer than the timeout fails the others with a message saying so") {
  ddp::InitOptions options;
  options.backend = ddp::Backend::Gloo;
  options.init_timeout = std::chrono::seconds(30);
  options.timeout = ddp::test::build_timeout(std::chrono::milliseconds(300));
  auto store = std::make_shared<ddp::store::MemoryStore>();
  std::mutex mutex;
  std::condition_variable cv;
  bool rank1_gave_up = false;
  std::string rank1_error;
  std::thread rank1([&] {
    try {
      ddp::Context ctx = ddp::init(ddp::test::thread_env(1, 2), store, options);
      ddp::rank_zero_first(ctx, [] {});
    } catch (const ddp::Error& e) {
      std::lock_guard lock(mutex);
      rank1_error = e.what();
    }
    std::lock_guard lock(mutex);
    rank1_gave_up = true;
    cv.notify_all();
  });
  try {
    ddp::Context ctx = ddp::init(ddp::test::thread_env(0, 2), store, options);
    ddp::rank_zero_first(ctx, [&] {  // the "download": outlasts rank 1's timeout
      std::unique_lock lock(mutex);
      cv.wait_for(lock, std::chrono::seconds(30), [&] { return rank1_gave_up; });
    });
  } catch (const ddp::Error&) {
    // Rank 1 is gone by now: rank 0's broadcast may fail too.
  }
  rank1.join();
  INFO(rank1_error);
  CHECK(rank1_error.find("rank_zero_first") != std::string::npos);
  CHECK(rank1_error.find("rank 0") != std::string::npos);
}
