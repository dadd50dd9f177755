#include "ddp/store/memory_store.hpp"

#include <catch2/catch.hpp>
#include <limits>
#include <thread>

using namespace std::chrono_literals;
using ddp::store::MemoryStore;

TEST_CASE("memory store: set, get, add as decimal text") {
  MemoryStore store;
  store.set("a", "1");
  CHECK(store.get("a") == "1");
  CHECK(store.add("n", 5) == 5);
  CHECK(store.add("n", -2) == 3);
  CHECK(store.get("n") == "3");
  store.set("text", "x");
  CHECK_THROWS_AS(store.add("text", 1), ddp::store::StoreError);
  CHECK(store.num_keys() == 3);
  CHECK(store.delete_key("a"));
  CHECK_FALSE(store.delete_key("a"));
}

TEST_CASE("memory store: compare_set follows PyTorch's missing-key rules") {
  MemoryStore store;
  CHECK(store.compare_set("k", "x", "y") == "x");  // missing, non-empty expected: no store
  CHECK_FALSE(store.check({"k"}));
  CHECK(store.compare_set("k", "", "y") == "y");   // missing, empty expected: store
  CHECK(store.compare_set("k", "y", "z") == "z");  // equal: replace
  CHECK(store.compare_set("k", "q", "w") == "z");  // different: current value
}

TEST_CASE("memory store: wait wakes when the last key is set, and times out naming keys") {
  MemoryStore store;
  std::thread setter([&] {
    store.set("a", "1");
    store.set("b", "2");
  });
  store.wait({"a", "b"}, 10s);
  setter.join();
  CHECK(store.multi_get({"a", "b"}) == std::vector<std::string>{"1", "2"});
  CHECK_THROWS_WITH(store.wait({"a", "missing"}, 10ms), Catch::Contains("'missing'"));
}

TEST_CASE(
    "memory store: ADD past INT64_MAX wraps as the server's does, without undefined behaviour") {
  MemoryStore store;
  constexpr auto kMax = std::numeric_limits<std::int64_t>::max();
  CHECK(store.add("n", kMax) == kMax);
  CHECK(store.add("n", 1) == std::numeric_limits<std::int64_t>::min());
  CHECK(store.get("n") == std::to_string(std::numeric_limits<std::int64_t>::min()));
}
