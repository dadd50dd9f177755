#include "ddp/launch_env.hpp"

#include <catch2/catch.hpp>
#include <cstdlib>

#include "ddp/context.hpp"
#include "test_support.hpp"

namespace {

// The torchrun variables for the duration of a test case.
class ScopedEnv : public ddp::test::ScopedEnvironment {
 public:
  explicit ScopedEnv(const std::map<std::string, std::string>& vars) : ScopedEnvironment(vars) {}
};

}  // namespace

TEST_CASE("LaunchEnv reads torchrun's variables, with local defaults") {
  ScopedEnv env({{"RANK", "2"},
                 {"WORLD_SIZE", "4"},
                 {"MASTER_ADDR", "127.0.0.1"},
                 {"MASTER_PORT", "29511"},
                 {"TORCHELASTIC_RESTART_COUNT", "3"},
                 {"TORCHELASTIC_USE_AGENT_STORE", "True"}});
  const auto e = ddp::LaunchEnv::from_environment();
  CHECK(e.rank == 2);
  CHECK(e.world_size == 4);
  CHECK(e.local_rank == 2);        // LOCAL_RANK unset: the global rank
  CHECK(e.local_world_size == 4);  // LOCAL_WORLD_SIZE unset: the world
  CHECK(e.master_port == 29511);
  CHECK(e.restart_count == 3);
  CHECK(e.use_agent_store);
}

TEST_CASE("LaunchEnv names the variable that is missing or malformed") {
  SECTION("missing") {
    ScopedEnv env({{"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}});
    REQUIRE_THROWS_WITH(ddp::LaunchEnv::from_environment(), Catch::Contains("RANK is not set"));
  }
  SECTION("not a number") {
    ScopedEnv env({{"RANK", "x1"}, {"WORLD_SIZE", "2"}});
    REQUIRE_THROWS_WITH(ddp::LaunchEnv::from_environment(), Catch::Contains("RANK='x1'"));
  }
  SECTION("rank outside the world") {
    ScopedEnv env({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}});
    REQUIRE_THROWS_AS(ddp::LaunchEnv::from_environment(), ddp::EnvError);
  }
}

TEST_CASE("init() without a launcher says what is missing") {
  REQUIRE_THROWS_AS(ddp::init(), ddp::EnvError);
}

TEST_CASE("a store that never answers fails init within its timeout, naming the endpoint") {
  // Rank 1 of 2 with rank 0 absent: nobody hosts the store at this port.
  ScopedEnv env({{"RANK", "1"},
                 {"WORLD_SIZE", "2"},
                 {"MASTER_ADDR", "127.0.0.1"},
                 {"MASTER_PORT", "1"},
                 {"DDP_BACKEND", "gloo"}});
  ddp::InitOptions options;
  options.init_timeout = ddp::test::build_timeout(std::chrono::milliseconds(300));
  REQUIRE_THROWS_WITH(ddp::init(options), Catch::Contains("127.0.0.1:1"));
}
