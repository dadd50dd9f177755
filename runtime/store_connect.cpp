// Connecting to the launcher's TCP store. Filled in with the store client.
#include "backends.hpp"

namespace ddp::detail {

std::pair<std::shared_ptr<store::Store>, std::shared_ptr<void>> connect_store(
    const LaunchEnv& env, const InitOptions&) {
  throw InitError("rank " + std::to_string(env.rank) + ": cannot reach the store at " +
                  env.master_addr + ":" + std::to_string(env.master_port) +
                  ": this build has no TCP store client");
}

}  // namespace ddp::detail
