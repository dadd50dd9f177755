#include "ddp/launcher/worker_env.hpp"

#include <unistd.h>

#include "ddp/launcher/signal_names.hpp"

extern char** environ;

namespace ddp::launcher {

std::map<std::string, std::string> worker_variables(
    const LaunchConfig& config, const MasterEndpoint& master, const WorkerIdentity& worker,
    const std::map<std::string, std::string>& base_env) {
  const elastic::WorkerRanks& ranks = worker.ranks;
  auto nccl = base_env.find("TORCH_NCCL_ASYNC_ERROR_HANDLING");
  std::map<std::string, std::string> variables = {
      {"RANK", std::to_string(ranks.rank)},
      {"LOCAL_RANK", std::to_string(worker.local_rank)},
      {"WORLD_SIZE", std::to_string(ranks.world_size)},
      {"LOCAL_WORLD_SIZE", std::to_string(ranks.local_world_size)},
      {"GROUP_RANK", std::to_string(ranks.group_rank)},
      {"GROUP_WORLD_SIZE", std::to_string(ranks.group_world_size)},
      {"ROLE_RANK", std::to_string(ranks.role_rank)},
      {"ROLE_NAME", config.role},
      {"ROLE_WORLD_SIZE", std::to_string(ranks.role_world_size)},
      {"MASTER_ADDR", master.addr},
      {"MASTER_PORT", std::to_string(master.port)},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(worker.restart_count)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(config.max_restarts)},
      {"TORCHELASTIC_RUN_ID", config.rdzv_id},
      {"TORCHELASTIC_USE_AGENT_STORE", master.agent_store ? "True" : "False"},
      {"TORCHELASTIC_ERROR_FILE", worker.error_file},
      {"TORCH_NCCL_ASYNC_ERROR_HANDLING", nccl == base_env.end() ? "1" : nccl->second},
  };
  // The name PyTorch 2.1 and older read: passed on only when the user set it, as torchrun 2.x
  // does (PyTorch 2.2+ warns on every rank that it is deprecated when it is set).
  if (auto old = base_env.find("NCCL_ASYNC_ERROR_HANDLING"); old != base_env.end()) {
    variables["NCCL_ASYNC_ERROR_HANDLING"] = old->second;
  }
  // torchrun 2.x puts --signals_to_handle in its own environment, so its workers see it.
  std::string signals;
  for (int signal : config.signals_to_handle) {
    signals += (signals.empty() ? "" : ",") + signal_name(signal);
  }
  variables["TORCHELASTIC_SIGNALS_TO_HANDLE"] = signals;
  if (config.virtual_local_rank) {  // each worker sees its own GPU as device 0
    variables["LOCAL_RANK"] = "0";
    variables["CUDA_VISIBLE_DEVICES"] = virtual_local_rank_device(base_env, worker.local_rank);
  }
  if (master.agent_store && !base_env.contains("DDP_STORE_DIALECT")) {
    variables["DDP_STORE_DIALECT"] = "v2";
  }
  return variables;
}

namespace {

std::vector<std::string> visible_devices(const std::map<std::string, std::string>& base_env) {
  std::vector<std::string> devices;
  auto visible = base_env.find("CUDA_VISIBLE_DEVICES");
  if (visible == base_env.end()) return devices;
  std::size_t start = 0;
  const std::string& list = visible->second;
  for (;;) {
    std::size_t end = list.find(',', start);
    std::string item = list.substr(start, end == std::string::npos ? end : end - start);
    const auto first = item.find_first_not_of(" \t");
    const auto last = item.find_last_not_of(" \t");
    devices.push_back(first == std::string::npos ? "" : item.substr(first, last - first + 1));
    if (end == std::string::npos) return devices;
    start = end + 1;
  }
}

}  // namespace

std::string virtual_local_rank_device(const std::map<std::string, std::string>& base_env,
                                      int local_rank) {
  if (!base_env.contains("CUDA_VISIBLE_DEVICES")) return std::to_string(local_rank);
  const std::vector<std::string> devices = visible_devices(base_env);
  const auto index = static_cast<std::size_t>(local_rank);
  return index < devices.size() ? devices[index] : "";
}

std::string virtual_local_rank_error(const LaunchConfig& config,
                                     const std::map<std::string, std::string>& base_env) {
  auto visible = base_env.find("CUDA_VISIBLE_DEVICES");
  if (!config.virtual_local_rank || visible == base_env.end()) return "";
  const std::size_t count = visible_devices(base_env).size();
  if (static_cast<std::size_t>(config.nproc_per_node) <= count) return "";
  return "--virtual_local_rank: local rank " + std::to_string(count) +
         " has no GPU in "
         "CUDA_VISIBLE_DEVICES=" +
         visible->second + " (" + std::to_string(count) + " listed for " +
         std::to_string(config.nproc_per_node) +
         " workers per node); list one device per worker, or start fewer workers";
}

bool needs_omp_default(const LaunchConfig& config,
                       const std::map<std::string, std::string>& base_env) {
  return config.nproc_per_node > 1 && !base_env.contains("OMP_NUM_THREADS");
}

std::string omp_notice() {
  return "ddprun: setting OMP_NUM_THREADS=1 for each worker (it was unset and there is more "
         "than one worker per node) so that the node is not oversubscribed; set it yourself "
         "to tune.";
}

std::vector<std::string> merge_environment(const std::map<std::string, std::string>& base_env,
                                           const std::map<std::string, std::string>& vars) {
  std::map<std::string, std::string> merged = base_env;
  for (const auto& [key, value] : vars) merged[key] = value;
  std::vector<std::string> env;
  env.reserve(merged.size());
  for (const auto& [key, value] : merged) env.push_back(key + "=" + value);
  return env;
}

std::map<std::string, std::string> current_environment() {
  std::map<std::string, std::string> env;
  for (char** entry = environ; entry && *entry; ++entry) {
    std::string text(*entry);
    std::size_t eq = text.find('=');
    if (eq != std::string::npos) env.emplace(text.substr(0, eq), text.substr(eq + 1));
  }
  return env;
}

}  // namespace ddp::launcher
