// RefusalLog: one line per address per window, and how many were refused without one.

#include "ddp/store/refusal_log.hpp"

#include <catch2/catch.hpp>

using ddp::store::RefusalLog;
using namespace std::chrono_literals;

TEST_CASE("RefusalLog: the first refusal of an address gets a line, the rest of its window none") {
  RefusalLog log(60s);
  const auto t0 = RefusalLog::Clock::time_point{} + 1000s;
  auto first = log.refused("10.0.0.9", "not a node of this job", t0);
  REQUIRE(first);
  CHECK(*first == "refused a connection from 10.0.0.9: not a node of this job");
  CHECK_FALSE(log.refused("10.0.0.9", "not a node of this job", t0 + 1s));
  CHECK_FALSE(log.refused("10.0.0.9", "not a node of this job", t0 + 59s));
  // Another address has its own window.
  CHECK(log.refused("10.0.0.8", "not a node of this job", t0 + 2s));
  // A window later: one line, counting the two that had none.
  auto later = log.refused("10.0.0.9", "not a node of this job", t0 + 60s);
  REQUIRE(later);
  CHECK(*later ==
        "refused a connection from 10.0.0.9: not a node of this job (and 2 more from it since "
        "its last line)");
  CHECK_FALSE(log.refused("10.0.0.9", "x", t0 + 61s));
  // A quiet address starts again without a count.
  auto quiet = log.refused("10.0.0.8", "y", t0 + 300s);
  REQUIRE(quiet);
  CHECK(*quiet == "refused a connection from 10.0.0.8: y");
}

TEST_CASE("RefusalLog: many addresses stay bounded and each still gets its first line") {
  RefusalLog log(60s);
  const auto t0 = RefusalLog::Clock::time_point{} + 1000s;
  std::size_t lines = 0;
  for (std::size_t i = 0; i < RefusalLog::kMaxAddresses + 10; ++i) {
    if (log.refused("10.1." + std::to_string(i / 256) + "." + std::to_string(i % 256), "x", t0)) {
      ++lines;
    }
  }
  CHECK(lines == RefusalLog::kMaxAddresses + 10);
}
