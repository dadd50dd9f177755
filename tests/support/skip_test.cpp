// Visible skips: a skipped test case exits with CTest's skip code and says why.
#include "skip.hpp"

#include <catch2/catch.hpp>

#include "test_support.hpp"

// Hidden ([.]): run only by the test below, through a child process.
TEST_CASE("skip demo: skipped", "[.]") { return ddp::test::skip("demo reason"); }
TEST_CASE("skip demo: passes", "[.]") { CHECK(1 + 1 == 2); }
TEST_CASE("skip demo: fails after a skip", "[.]") {
  ddp::test::skip("demo reason");
  CHECK(1 + 1 == 3);
}

TEST_CASE("a skipped test case exits with CTest's skip code and prints the reason") {
  const std::string self = ddp::test::bin_path("support_skip_test").string();
  auto skipped = ddp::test::run_shell(self + " 'skip demo: skipped'", 60);
  INFO(skipped.output);
  CHECK(skipped.status == ddp::test::kSkipReturnCode);
  CHECK_THAT(skipped.output, Catch::Contains("SKIPPED: demo reason"));
  // A run with one test case that did run is not a skip; a failure is never one.
  CHECK(ddp::test::run_shell(self + " 'skip demo: skipped,skip demo: passes'", 60).status == 0);
  auto failed = ddp::test::run_shell(self + " 'skip demo: fails after a skip'", 60);
  CHECK(failed.status != 0);
  CHECK(failed.status != ddp::test::kSkipReturnCode);
}
