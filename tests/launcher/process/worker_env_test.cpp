// The worker environment contract, in-process (the process tests check it end to end).
#include "ddp/launcher/worker_env.hpp"

#include <catch2/catch.hpp>
#include <csignal>
#include <set>

#include "ddp/common/worker_contract.hpp"

using namespace ddp::launcher;

namespace {

// A round of one node with `local_world` workers.
ddp::elastic::RoundInfo one_node(int local_world) {
  ddp::elastic::RoundInfo round;
  round.members.push_back({"n0", "h0", "", local_world, "trainer"});
  return round;
}

WorkerIdentity identity(const ddp::elastic::RoundInfo& round, int local_rank, int restart,
                        std::string error_file) {
  return {local_rank, restart, std::move(error_file),
          ddp::elastic::worker_ranks(round, local_rank)};
}

}  // namespace

TEST_CASE("worker_variables sets exactly torchrun's contract") {
  LaunchConfig config;
  config.nproc_per_node = 4;
  config.max_restarts = 3;
  config.rdzv_id = "job";
  config.role = "trainer";
  config.signals_to_handle = {SIGTERM, SIGUSR1};
  MasterEndpoint master{"127.0.0.1", 29511, false};
  const auto round = one_node(4);
  auto vars = worker_variables(config, master, identity(round, 2, 1, "/l/error.json"), {});
  std::map<std::string, std::string> expected = {
      {"RANK", "2"},
      {"LOCAL_RANK", "2"},
      {"WORLD_SIZE", "4"},
      {"LOCAL_WORLD_SIZE", "4"},
      {"GROUP_RANK", "0"},
      {"GROUP_WORLD_SIZE", "1"},
      {"ROLE_RANK", "2"},
      {"ROLE_NAME", "trainer"},
      {"ROLE_WORLD_SIZE", "4"},
      {"MASTER_ADDR", "127.0.0.1"},
      {"MASTER_PORT", "29511"},
      {"TORCHELASTIC_RESTART_COUNT", "1"},
      {"TORCHELASTIC_MAX_RESTARTS", "3"},
      {"TORCHELASTIC_RUN_ID", "job"},
      {"TORCHELASTIC_USE_AGENT_STORE", "False"},
      {"TORCHELASTIC_ERROR_FILE", "/l/error.json"},
      {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"},
      {"TORCHELASTIC_SIGNALS_TO_HANDLE", "SIGTERM,SIGUSR1"},  // torchrun 2.x
      // Not NCCL_ASYNC_ERROR_HANDLING, the name PyTorch 2.1 and older read: PyTorch 2.2+
      // warns on every rank when it is set; passed on only when the user set it (below).
  };
  CHECK(vars == expected);

  master.agent_store = true;
  auto with_store = worker_variables(config, master, identity(round, 0, 0, "e"),
                                     {{"TORCH_NCCL_ASYNC_ERROR_HANDLING", "0"}});
  CHECK(with_store.at("TORCHELASTIC_USE_AGENT_STORE") == "True");
  CHECK(with_store.at("TORCH_NCCL_ASYNC_ERROR_HANDLING") == "0");
  CHECK(worker_variables(config, master, identity(round, 0, 0, "e"),
                         {{"NCCL_ASYNC_ERROR_HANDLING", "0"}})
            .at("NCCL_ASYNC_ERROR_HANDLING") == "0");
  CHECK(with_store.at("DDP_STORE_DIALECT") == "v2");  // libddp: our store's 2.x dialect
  auto chosen =
      worker_variables(config, master, identity(round, 0, 0, "e"), {{"DDP_STORE_DIALECT", "v1"}});
  CHECK_FALSE(chosen.contains("DDP_STORE_DIALECT"));  // the user's own choice is inherited
}

TEST_CASE("ranks come from the round: a second node with a different local world size") {
  LaunchConfig config;
  config.nproc_per_node = 3;
  config.role = "trainer";
  ddp::elastic::RoundInfo round;
  round.members.push_back({"n0", "h0", "", 2, "trainer"});
  round.members.push_back({"n1", "h1", "", 3, "trainer"});
  round.group_rank = 1;
  auto vars = worker_variables(config, {"10.0.0.1", 29500, true}, identity(round, 1, 0, "e"), {});
  CHECK(vars.at("RANK") == "3");
  CHECK(vars.at("LOCAL_RANK") == "1");
  CHECK(vars.at("WORLD_SIZE") == "5");
  CHECK(vars.at("LOCAL_WORLD_SIZE") == "3");
  CHECK(vars.at("GROUP_RANK") == "1");
  CHECK(vars.at("GROUP_WORLD_SIZE") == "2");
  CHECK(vars.at("ROLE_RANK") == "3");
  CHECK(vars.at("ROLE_WORLD_SIZE") == "5");
  CHECK(vars.at("MASTER_ADDR") == "10.0.0.1");
}

TEST_CASE("OMP_NUM_THREADS defaults to 1 only when unset with several workers") {
  LaunchConfig config;
  config.nproc_per_node = 2;
  CHECK(needs_omp_default(config, {}));
  CHECK_FALSE(needs_omp_default(config, {{"OMP_NUM_THREADS", "8"}}));
  config.nproc_per_node = 1;
  CHECK_FALSE(needs_omp_default(config, {}));
}

TEST_CASE("merge_environment overlays the contract on the agent's environment") {
  auto env = merge_environment({{"PATH", "/bin"}, {"RANK", "9"}}, {{"RANK", "0"}});
  CHECK(env == std::vector<std::string>{"PATH=/bin", "RANK=0"});
}

TEST_CASE("every variable given to workers is in the worker contract the runtime reads") {
  LaunchConfig config;
  config.nproc_per_node = 2;
  MasterEndpoint master{"127.0.0.1", 29500, true};
  auto vars = worker_variables(config, master, WorkerIdentity{1, 0, "e", {}}, {});
  const std::set<std::string> contract(std::begin(ddp::contract::kWorkerVariables),
                                       std::end(ddp::contract::kWorkerVariables));
  for (const auto& [name, value] : vars) {
    INFO(name);
    CHECK(contract.contains(name));
  }
}
