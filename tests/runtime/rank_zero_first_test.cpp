#include <catch2/catch.hpp>

#include <atomic>

#include "ddp/rank_zero_first.hpp"
#include "thread_world.hpp"

TEST_CASE("rank_zero_first: rank 0 finishes the block before any other rank starts it") {
  std::atomic<bool> rank0_done{false};
  std::atomic<int> ran{0};
  ddp::test::run_world(3, [&](ddp::Context& ctx) {
    ddp::rank_zero_first(ctx, [&] {
      if (ctx.rank() == 0) rank0_done = true;
      else REQUIRE(rank0_done.load());
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
      CHECK(std::string(e.what()).find("failed on rank 0") != std::string::npos);
      others_failed.fetch_add(1);
    } catch (const std::runtime_error& e) {
      CHECK(ctx.rank() == 0);
      CHECK(std::string(e.what()) == "download failed");
    }
  });
  REQUIRE(others_failed.load() == 2);
  REQUIRE(others_ran.load() == 0);
}
