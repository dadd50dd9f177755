#pragma once
// Helpers shared by the multi-node process tests: the ddprun command line (ports from
// reserve_port(), test_support.hpp), and the workers' --env-json files. Header-only; every function
// asserts on the calling (main) thread.

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "process_harness.hpp"
#include "test_support.hpp"

namespace ddp::test {

// How long a multi-node test waits for a whole job (generous: ASan under ctest -j2).
inline constexpr milliseconds kJobTimeout{90000};

// build/bin/ddprun OPTIONS build/bin/ddp-sample-worker WORKER_ARGS
inline std::vector<std::string> ddprun(const std::vector<std::string>& options,
                                       const std::vector<std::string>& worker_args) {
  std::vector<std::string> argv = {bin_path("ddprun").string()};
  argv.insert(argv.end(), options.begin(), options.end());
  argv.push_back(bin_path("ddp-sample-worker").string());
  argv.insert(argv.end(), worker_args.begin(), worker_args.end());
  return argv;
}

// The options of one node of a static job on 127.0.0.1:port.
inline std::vector<std::string> static_node(int node_rank, int nnodes, int port,
                                            const std::string& addr = "127.0.0.1") {
  return {"--nnodes=" + std::to_string(nnodes),
          "--node_rank=" + std::to_string(node_rank),
          "--master_addr=" + addr,
          "--master_port=" + std::to_string(port),
          "--nproc_per_node=1",
          "--monitor_interval=0.1"};
}

// The options of one node of a c10d job at endpoint:port with run id, nnodes "MIN:MAX".
inline std::vector<std::string> c10d_node(const std::string& nnodes, int port,
                                          const std::string& run_id,
                                          const std::string& addr = "127.0.0.1") {
  return {"--nnodes=" + nnodes,
          "--rdzv_backend=c10d",
          "--rdzv_endpoint=" + addr + ":" + std::to_string(port),
          "--rdzv_id=" + run_id,
          "--nproc_per_node=1",
          "--monitor_interval=0.1"};
}

inline nlohmann::json read_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  INFO("reading " << path);
  REQUIRE(in.good());
  return nlohmann::json::parse(in);
}

// Creates an empty file (what --wait-for-file waits for).
inline void touch(const std::filesystem::path& path) {
  std::ofstream out(path);
  REQUIRE(out.good());
}

}  // namespace ddp::test
