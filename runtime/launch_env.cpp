#include "ddp/launch_env.hpp"

#include <charconv>
#include <cstdlib>

#include "ddp/common/worker_contract.hpp"
#include "ddp/types.hpp"

namespace ddp {

namespace {

int parse_int(const char* name, const std::string& text, int min_value) {
  int value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < min_value) {
    throw EnvError(std::string("environment variable ") + name + "='" + text +
                   "' is not an integer >= " + std::to_string(min_value));
  }
  return value;
}

std::string require(const char* name) {
  auto value = get_env(name);
  if (!value) {
    throw EnvError(std::string("environment variable ") + name +
                   " is not set: start this program with ddprun or torchrun, or pass the "
                   "world explicitly to ddp::init");
  }
  return *value;
}

int int_or(const char* name, int fallback, int min_value) {
  auto value = get_env(name);
  return value ? parse_int(name, *value, min_value) : fallback;
}

}  // namespace

std::optional<std::string> get_env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

LaunchEnv LaunchEnv::from_environment() {
  LaunchEnv env;
  env.rank = parse_int(contract::kRank, require(contract::kRank), 0);
  env.world_size = parse_int(contract::kWorldSize, require(contract::kWorldSize), 1);
  if (env.rank >= env.world_size) {
    throw EnvError("RANK=" + std::to_string(env.rank) +
                   " is not below WORLD_SIZE=" + std::to_string(env.world_size));
  }
  env.master_addr = require(contract::kMasterAddr);
  env.master_port = parse_int(contract::kMasterPort, require(contract::kMasterPort), 1);
  env.local_rank = int_or(contract::kLocalRank, env.rank, 0);
  env.local_world_size = int_or(contract::kLocalWorldSize, env.world_size, 1);
  env.restart_count = int_or(contract::kRestartCount, 0, 0);
  auto agent_store = get_env(contract::kUseAgentStore);
  env.use_agent_store =
      agent_store && (*agent_store == "True" || *agent_store == "true" || *agent_store == "1");
  env.run_id = get_env(contract::kRunId).value_or("");
  return env;
}

}  // namespace ddp
