#pragma once
// The launcher's environment contract (torchrun's, which ddprun honours): who this worker is
// and where the store is.

#include <optional>
#include <string>

namespace ddp {

struct LaunchEnv {
  int rank = 0;                    // RANK: global rank
  int world_size = 1;              // WORLD_SIZE
  int local_rank = 0;              // LOCAL_RANK: rank on this node
  int local_world_size = 1;        // LOCAL_WORLD_SIZE: workers on this node
  std::string master_addr;         // MASTER_ADDR: the store's host
  int master_port = 0;             // MASTER_PORT: the store's port
  int restart_count = 0;           // TORCHELASTIC_RESTART_COUNT: attempt number (0 first)
  bool use_agent_store = false;    // TORCHELASTIC_USE_AGENT_STORE: the agent hosts the store
  std::string run_id;              // TORCHELASTIC_RUN_ID ("" when unset)

  // Reads the variables above. RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT are required;
  // LOCAL_RANK defaults to RANK and LOCAL_WORLD_SIZE to WORLD_SIZE. Throws EnvError naming the
  // variable that is missing or malformed.
  static LaunchEnv from_environment();
};

// The value of an environment variable, nullopt when unset.
std::optional<std::string> get_env(const char* name);

}  // namespace ddp
