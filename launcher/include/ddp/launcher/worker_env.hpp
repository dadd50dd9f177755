#pragma once
// torchrun's worker environment contract: the variables every worker gets on top of the
// agent's own environment.

#include <map>
#include <string>
#include <vector>

#include "ddp/elastic/rendezvous.hpp"
#include "ddp/launcher/launch_config.hpp"
#include "ddp/launcher/master_endpoint.hpp"

namespace ddp::launcher {

// Who one worker is, in one round.
struct WorkerIdentity {
  int local_rank = 0;
  int restart_count = 0;       // TORCHELASTIC_RESTART_COUNT: rounds that followed a worker failure
  std::string error_file;      // TORCHELASTIC_ERROR_FILE
  elastic::WorkerRanks ranks;  // RANK WORLD_SIZE GROUP_RANK ...: elastic::worker_ranks(round)
};

// The contract variables for one worker (ranks from worker.ranks, not from config): RANK LOCAL_RANK
// WORLD_SIZE LOCAL_WORLD_SIZE GROUP_RANK GROUP_WORLD_SIZE ROLE_RANK ROLE_NAME ROLE_WORLD_SIZE
// MASTER_ADDR MASTER_PORT TORCHELASTIC_RESTART_COUNT TORCHELASTIC_MAX_RESTARTS TORCHELASTIC_RUN_ID
// TORCHELASTIC_USE_AGENT_STORE TORCHELASTIC_ERROR_FILE TORCH_NCCL_ASYNC_ERROR_HANDLING
// TORCHELASTIC_SIGNALS_TO_HANDLE (torchrun 2.x: the --signals_to_handle names); with
// --virtual_local_rank, LOCAL_RANK=0 and CUDA_VISIBLE_DEVICES (virtual_local_rank_device).
// base_env supplies TORCH_NCCL_ASYNC_ERROR_HANDLING when set there (default "1").
// Beyond torchrun's contract: DDP_STORE_DIALECT=v2 when the agent hosts the store and
// base_env does not set it, so libddp workers speak our store's newer dialect (MULTI_GET,
// APPEND) instead of probing, which a 1.x-capable server answers in 1.x.
std::map<std::string, std::string> worker_variables(
    const LaunchConfig& config, const MasterEndpoint& master, const WorkerIdentity& worker,
    const std::map<std::string, std::string>& base_env);

// --virtual_local_rank: the CUDA_VISIBLE_DEVICES of local_rank's worker: the local_rank-th
// entry of base_env's CUDA_VISIBLE_DEVICES, or the local rank when it is unset (torchrun 2.x).
std::string virtual_local_rank_device(const std::map<std::string, std::string>& base_env,
                                      int local_rank);
// Why --virtual_local_rank cannot give every worker a device (CUDA_VISIBLE_DEVICES lists fewer
// than --nproc_per_node), or "".
std::string virtual_local_rank_error(const LaunchConfig& config,
                                     const std::map<std::string, std::string>& base_env);

// True when the agent should set OMP_NUM_THREADS=1 (unset, and more than one worker).
bool needs_omp_default(const LaunchConfig& config,
                       const std::map<std::string, std::string>& base_env);
// The one-time notice printed when it does.
std::string omp_notice();

// "KEY=VALUE" strings of base_env overlaid with vars, for execve.
std::vector<std::string> merge_environment(const std::map<std::string, std::string>& base_env,
                                           const std::map<std::string, std::string>& vars);

// The calling process's environment as a map.
std::map<std::string, std::string> current_environment();

}  // namespace ddp::launcher
