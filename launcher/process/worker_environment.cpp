#include "process/worker_environment.hpp"

#include <algorithm>

#include "ddp/common/worker_contract.hpp"
#include "process/nccl_profiler_lookup.hpp"
#include "process/python_probe.hpp"

namespace ddp::launcher {
namespace {

// PyTorch's Flight Recorder (its NCCL process groups): the last collectives of each rank in a
// ring, dumped to <attempt dir>/nccl_trace_rank_<rank> when a collective times out. Both the
// 2.x names and the newer TORCH_FR_ ones; nothing when the user set any of them. A PyTorch that
// reads the TORCH_FR_ names warns on every rank about the old ones: DDPRUN_FR_OLD_NAMES lists
// them, and the Python probe drops them there before the first process group is made.
void add_flight_recorder(std::vector<std::string>& env, const std::string& prefix) {
  static const char* const kNames[] = {
      "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_DUMP_ON_TIMEOUT",
      "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_FR_DUMP_TEMP_FILE"};
  for (const std::string& entry : env) {
    for (const char* name : kNames) {
      if (entry.starts_with(std::string(name) + "=")) return;
    }
  }
  env.push_back("TORCH_NCCL_TRACE_BUFFER_SIZE=2000");
  env.push_back("TORCH_FR_BUFFER_SIZE=2000");
  env.push_back("TORCH_NCCL_DUMP_ON_TIMEOUT=1");
  env.push_back("TORCH_NCCL_DEBUG_INFO_TEMP_FILE=" + prefix);
  env.push_back("TORCH_FR_DUMP_TEMP_FILE=" + prefix);
  env.push_back(std::string(contract::kFlightRecorderOldNames) +
                "=TORCH_NCCL_TRACE_BUFFER_SIZE,TORCH_NCCL_DEBUG_INFO_TEMP_FILE");
}

// Drops the variables an outer ddprun gave this one (it runs as a worker): each worker gets
// its own page, stack file, probe path and modules list.
void drop_outer_variables(std::vector<std::string>& env) {
  std::erase_if(env, [](const std::string& entry) {
    return entry.starts_with(std::string(contract::kRecordFd) + "=") ||
           entry.starts_with(std::string(contract::kStackFd) + "=") ||
           entry.starts_with(std::string(contract::kStackSignal) + "=") ||
           entry.starts_with(std::string(contract::kModulesFile) + "=") ||
           entry.starts_with(std::string(contract::kUserPythonPath) + "=") ||
           entry.starts_with(std::string(contract::kInplaceGeneration) + "=");
  });
}

// NCCL_PROFILER_PLUGIN=<ddprun's plugin>, unless env names a plugin already (or "none").
void add_nccl_profiler(std::vector<std::string>& env, const NodeEnvironment& node) {
  if (node.nccl_profiler.empty()) return;
  const std::string key = std::string(kNcclProfilerPluginVariable) + "=";
  if (std::any_of(env.begin(), env.end(), [&](const std::string& e) { return e.starts_with(key); }))
    return;
  env.push_back(key + node.nccl_profiler.string());
}

// PYTHONPATH with the probe first, and the signal it dumps stacks on.
bool add_python_probe(std::vector<std::string>& env, const NodeEnvironment& node) {
  if (!node.python || node.python_probe_dir.empty()) return false;
  add_python_probe_path(env, node.python_probe_dir);
  env.push_back(std::string(contract::kStackSignal) + "=" + std::to_string(node.stack_signal));
  return true;
}

// What torchrun gives the worker, and no more: worker_variables less libddp's store dialect
// (unless the user set it).
std::vector<std::string> torchrun_environment(const NodeEnvironment& node,
                                              const LaunchConfig& config,
                                              const MasterEndpoint& master,
                                              const WorkerIdentity& worker) {
  std::map<std::string, std::string> variables =
      worker_variables(config, master, worker, node.base_env);
  variables.erase(contract::kStoreDialect);
  std::vector<std::string> env = merge_environment(node.base_env, variables);
  drop_outer_variables(env);
  return env;
}

}  // namespace

std::vector<std::string> worker_environment(const NodeEnvironment& node, const LaunchConfig& config,
                                            const MasterEndpoint& master,
                                            const WorkerIdentity& worker,
                                            const WorkerOwnVariables& own) {
  if (node.torchrun_only) return torchrun_environment(node, config, master, worker);
  std::vector<std::string> env =
      merge_environment(node.base_env, worker_variables(config, master, worker, node.base_env));
  if (node.python) add_flight_recorder(env, own.flight_dumps);
  drop_outer_variables(env);
  if (!own.record.empty()) env.push_back(own.record);
  if (!own.modules.empty()) env.push_back(own.modules);
  if (!own.inplace_generation.empty()) env.push_back(own.inplace_generation);
  add_nccl_profiler(env, node);
  if (add_python_probe(env, node) && !own.stack.empty()) env.push_back(own.stack);
  return env;
}

std::vector<std::string> template_environment(const NodeEnvironment& node) {
  std::vector<std::string> env = merge_environment(node.base_env, {});
  drop_outer_variables(env);
  add_nccl_profiler(env, node);
  add_python_probe(env, node);
  return env;
}

}  // namespace ddp::launcher
