#pragma once
// Building a communicator for a backend. Internal to libddp.

#include <memory>

#include "ddp/context.hpp"

namespace ddp::detail {

// True when libddp was built with NCCL and this process sees at least one CUDA device.
bool nccl_usable();

// Builds the NCCL communicator through `store` (a view private to it). Throws Unsupported
// when libddp was built without CUDA, InitError on failure (naming missing ranks).
std::unique_ptr<Communicator> make_nccl_communicator(std::shared_ptr<store::Store> store,
                                                     const LaunchEnv& env,
                                                     const InitOptions& options,
                                                     MismatchCheck check);

// Builds the Gloo communicator through `store` (a view private to it).
std::unique_ptr<Communicator> make_gloo_communicator(store::Store& store, const LaunchEnv& env,
                                                     const InitOptions& options,
                                                     MismatchCheck check);

// Connects to the launcher's store (hosting it on rank 0 unless the agent does). Returns the
// store and what keeps it alive (the server, on the hosting rank).
std::pair<std::shared_ptr<store::Store>, std::shared_ptr<void>> connect_store(
    const LaunchEnv& env, const InitOptions& options);

// A second connection to the store connect_store() reached (never hosting one).
std::shared_ptr<store::Store> connect_client(const LaunchEnv& env, const InitOptions& options);

// init() with the Context's keys under `prefix` of `store` instead of ddp/attempt_<restart>.
Context init_under(const LaunchEnv& env, std::shared_ptr<store::Store> store,
                   const std::string& prefix, const InitOptions& options);

}  // namespace ddp::detail
