#include "ddp/store/prefix_store.hpp"

#include <catch2/catch.hpp>

#include "ddp/store/memory_store.hpp"

TEST_CASE("prefix store: keys live under prefix/") {
  auto base = std::make_shared<ddp::store::MemoryStore>();
  ddp::store::PrefixStore view("ddp/attempt_0", base);
  view.set("x", "1");
  CHECK(base->get("ddp/attempt_0/x") == "1");
  CHECK(view.add("c", 2) == 2);
  CHECK(view.multi_get({"x", "c"}) == std::vector<std::string>{"1", "2"});
  CHECK(view.check({"x"}));
  CHECK_FALSE(base->check({"x"}));
}
