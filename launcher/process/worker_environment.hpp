#pragma once
// The environment of a node's workers, built in one place: each worker's as it is exec'd, and
// the warm template's (the same without a rank's variables), from which a forked worker's is
// reached by the worker's own changes (the template compares the two). Internal to the
// launcher.

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "ddp/launcher/launch_config.hpp"
#include "ddp/launcher/master_endpoint.hpp"
#include "ddp/launcher/worker_env.hpp"

namespace ddp::launcher {

// What every worker of the node gets, whatever its rank.
struct NodeEnvironment {
  std::map<std::string, std::string> base_env;  // before torchrun's contract (the agent's own)
  bool python = false;                          // a Python entrypoint
  // ddprun's Python probe (first on PYTHONPATH) and the signal it dumps stacks on; empty: none.
  std::filesystem::path python_probe_dir;
  int stack_signal = 0;
  // ddprun's NCCL profiler plugin (NCCL_PROFILER_PLUGIN unless the user names one); empty: none.
  std::filesystem::path nccl_profiler;
  // The Python never loads the probe (python_isolation.hpp): torchrun's contract alone, so that
  // nothing of ddprun's reaches the workers or their children.
  bool torchrun_only = false;
};

// What is one worker's own beyond torchrun's contract: "K=V" entries, empty when it has none.
struct WorkerOwnVariables {
  std::string record;                // its collective record page
  std::string stack;                 // its stack file (a Python worker with the probe)
  std::string modules;               // its modules list (--warm_start)
  std::string flight_dumps;          // where PyTorch's Flight Recorder dumps go: <attempt>/<prefix>
  std::string inplace_generation{};  // --restart_policy=inplace: its DDPRUN_INPLACE_GENERATION
};

// One worker's environment, in the order it is exec'd with: base_env with torchrun's contract
// for `worker` (and, with torchrun_only, nothing more: no variable of ddprun's, `own` unused,
// the outer ddprun's variables dropped); for a Python worker the Flight Recorder's variables (none
// when the user set any); the variables an outer ddprun gave this one dropped; its own; the NCCL
// plugin; the probe's PYTHONPATH and signal, then its stack file.
std::vector<std::string> worker_environment(const NodeEnvironment& node, const LaunchConfig& config,
                                            const MasterEndpoint& master,
                                            const WorkerIdentity& worker,
                                            const WorkerOwnVariables& own);

// The warm template's: base_env with what the workers share of the above (the outer ddprun's
// variables dropped, the NCCL plugin, the probe), no rank's variables.
std::vector<std::string> template_environment(const NodeEnvironment& node);

}  // namespace ddp::launcher
