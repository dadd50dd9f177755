#pragma once
// The worker contract: everything that passes between ddprun and a worker, named once here.
// - the environment variables a launcher (ddprun, torchrun) gives each worker and libddp reads;
// - ddprun's own variables (DDPRUN_*), read by its Python probe, its NCCL plugin, libddp or
//   the warm template, and the variables a user sets to steer ddprun's worker-side code;
// - the warm template's protocol: every request and answer.
// Shared by launcher/, runtime/ and worker/ (a private, header-only include; not installed).
// worker/python/_ddprun_contract.py mirrors ddprun's variables and the template's protocol for
// the Python side, name for name: tests/worker/contract_test.cpp fails when the two differ.

namespace ddp::contract {

// A name of the contract as the Python mirror spells it, and its value.
struct Name {
  const char* python;
  const char* value;
};

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
inline constexpr const char* kSignalsToHandle = "TORCHELASTIC_SIGNALS_TO_HANDLE";    // 2.x
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
    kSignalsToHandle,
    kOmpNumThreads,
    kStoreDialect,
};

// ddprun's own variables, set for a worker by the agent (docs/cli.md's table lists them).
// The collective record page (an inherited memfd: common/collective_record.hpp's layout),
// which libddp, the NCCL plugin and the Python probe write and the agent reads.
inline constexpr const char* kRecordFd = "DDPRUN_RECORD_FD";
// The file the Python probe writes every thread's stack into (an inherited descriptor), and
// the signal that asks it to.
inline constexpr const char* kStackFd = "DDPRUN_STACK_FD";
inline constexpr const char* kStackSignal = "DDPRUN_STACK_SIGNAL";
// Where the probe writes the modules the worker imported (--warm_start).
inline constexpr const char* kModulesFile = "DDPRUN_MODULES_FILE";
// The user's PYTHONPATH, kept while the probe's folder is first on PYTHONPATH (sitecustomize
// puts it back); unset when the user had none.
inline constexpr const char* kUserPythonPath = "DDPRUN_PYTHONPATH";
// The Flight Recorder variables under their old names, which the probe drops where PyTorch
// reads the TORCH_FR_ ones (comma-separated).
inline constexpr const char* kFlightRecorderOldNames = "DDPRUN_FR_OLD_NAMES";
// The warm template's end of its socket pair, and the room padded into its environment for a
// forked worker's (the template's alone: never a worker's).
inline constexpr const char* kTemplateFd = "DDPRUN_TEMPLATE_FD";
inline constexpr const char* kTemplatePad = "DDPRUN_TEMPLATE_PAD";
// --restart_policy=inplace: the generation of the job's process group a worker starts in (0 for
// the round's first workers, G for a replacement), which ddprun.inplace reads.
inline constexpr const char* kInplaceGeneration = "DDPRUN_INPLACE_GENERATION";

// Set by the user, read by ddprun: "0" turns the Python probe off; "0" turns ddprun's NCCL
// profiler plugin off.
inline constexpr const char* kPythonProbe = "DDPRUN_PYTHON_PROBE";
inline constexpr const char* kNcclProfiler = "DDPRUN_NCCL_PROFILER";

inline constexpr Name kDdprunVariables[] = {
    {"RECORD_FD", kRecordFd},
    {"STACK_FD", kStackFd},
    {"STACK_SIGNAL", kStackSignal},
    {"MODULES_FILE", kModulesFile},
    {"USER_PYTHONPATH", kUserPythonPath},
    {"FR_OLD_NAMES", kFlightRecorderOldNames},
    {"TEMPLATE_FD", kTemplateFd},
    {"TEMPLATE_PAD", kTemplatePad},
    {"INPLACE_GENERATION", kInplaceGeneration},
    {"PYTHON_PROBE", kPythonProbe},
    {"NCCL_PROFILER", kNcclProfiler},
};

// The warm template's protocol (worker/python/_ddprun_template.py): the agent's end of a
// SOCK_SEQPACKET pair, one JSON object a message, its kind in kOp. Each request gets one
// answer; the template answers nothing else, and exits at the end of the socket.
//
//   request                                      answer
//   prepare  preload lists own varying           prepared  imported failed modules seconds
//                                                          problem
//   spawn    program argv env given cwd cpus     spawned   pid
//            fds guard agent blind, + the        cold      reason
//            descriptors
//            (SCM_RIGHTS) in the order of fds,
//            then the group guard's channel
//
// prepare: import the preload modules (torch, --warm_preload's) that are installed code, never
//   from the own folders, in the template's own environment, then read the lists (the probe's
//   modules.txt): a worker that imported a module the template holds after changing its
//   environment makes the template unusable, as does an import that reads one of the varying
//   variables. prepared: how many modules it holds and how long the imports took; problem: why
//   it must not fork (a thread, a descriptor, a print, the CUDA driver, a varying variable
//   read, an import the workers ran in another environment).
// spawn: fork the worker that `program` with `argv` in `cwd` with `env` would exec (given: the
//   template's environment as ddprun gave it; blind: no worker said what it imported yet).
//   spawned: its pid (the agent's child: the agent is a subreaper while it waits); cold: why
//   not. A forked worker whose own site start-up would have changed torch's import (a
//   variable set, an import hook) execs `program` itself, cold, saying so on its stderr.
namespace warm_template {
inline constexpr const char* kOp = "op";
inline constexpr const char* kPrepare = "prepare";
inline constexpr const char* kPrepared = "prepared";
inline constexpr const char* kSpawn = "spawn";
inline constexpr const char* kSpawned = "spawned";
inline constexpr const char* kCold = "cold";

inline constexpr Name kMessages[] = {
    {"OP", kOp},       {"PREPARE", kPrepare}, {"PREPARED", kPrepared},
    {"SPAWN", kSpawn}, {"SPAWNED", kSpawned}, {"COLD", kCold},
};
}  // namespace warm_template

}  // namespace ddp::contract
