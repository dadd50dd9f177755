#pragma once
// The worker contract: the environment variables a launcher (ddprun, torchrun) gives each
// worker and libddp reads. One list, shared by launcher/ and runtime/ (a private,
// header-only include of both; not installed).

namespace ddp::contract {

// torchrun's variables.
inline constexpr const char* kRank = "RANK";
inline constexpr const char* kLocalRank = "LOCAL_RANK";
inline constexpr const char* kWorldSize = "WORLD_SIZE";
inline constexpr const char* kLocalWorldSize = "LOCAL_WORLD_SIZE";
inline constexpr const char* kGroupRank = "GROUP_RANK";
inline constexpr const char* kGroupWorldSize = "GROUP_WORLD_SIZE";
inline constexpr const char* kRoleRank = "ROLE_RANK";
inline constexpr const char* kRoleName = "ROLE_NAME";
inline constexpr const char* kRoleWorldSize = "ROLE_WORLD_SIZE";
inline constexpr const char* kMasterAddr = "MASTER_ADDR";
inline constexpr const char* kMasterPort = "MASTER_PORT";
inline constexpr const char* kRestartCount = "TORCHELASTIC_RESTART_COUNT";
inline constexpr const char* kMaxRestarts = "TORCHELASTIC_MAX_RESTARTS";
inline constexpr const char* kRunId = "TORCHELASTIC_RUN_ID";
inline constexpr const char* kUseAgentStore = "TORCHELASTIC_USE_AGENT_STORE";
inline constexpr const char* kErrorFile = "TORCHELASTIC_ERROR_FILE";
inline constexpr const char* kTorchNcclAsyncErrorHandling = "TORCH_NCCL_ASYNC_ERROR_HANDLING";
inline constexpr const char* kNcclAsyncErrorHandling = "NCCL_ASYNC_ERROR_HANDLING";  // <= 2.1
inline constexpr const char* kOmpNumThreads = "OMP_NUM_THREADS";

// ddprun's own, read by libddp: the agent's store speaks PyTorch 2.x's dialect ("v2").
inline constexpr const char* kStoreDialect = "DDP_STORE_DIALECT";

// Every variable ddprun sets for each worker (OMP_NUM_THREADS and DDP_STORE_DIALECT only
// when unset, NCCL_ASYNC_ERROR_HANDLING only when the user set it), in the order of
// docs/cli.md.
inline constexpr const char* kWorkerVariables[] = {
    kRank,
    kLocalRank,
    kWorldSize,
    kLocalWorldSize,
    kGroupRank,
    kGroupWorldSize,
    kRoleRank,
    kRoleName,
    kRoleWorldSize,
    kMasterAddr,
    kMasterPort,
    kRestartCount,
    kMaxRestarts,
    kRunId,
    kUseAgentStore,
    kErrorFile,
    kTorchNcclAsyncErrorHandling,
    kNcclAsyncErrorHandling,
    kOmpNumThreads,
    kStoreDialect,
};

}  // namespace ddp::contract
