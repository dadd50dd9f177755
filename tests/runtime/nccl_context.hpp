#pragma once
// The NCCL tests' contexts: rank `rank` of `world` over a store, as a thread of this process
// (thread_world.hpp). One GPU holds one rank of a communicator, so most cases use world 1.

#include <chrono>
#include <memory>

#include "ddp/runtime.hpp"
#include "ddp/store/memory_store.hpp"
#include "test_support.hpp"
#include "thread_world.hpp"

namespace ddp::test {

inline ddp::Context nccl_context(std::shared_ptr<ddp::store::Store> store, int rank, int world,
                                 std::chrono::milliseconds init_timeout) {
  ddp::InitOptions options;
  options.backend = ddp::Backend::Nccl;
  options.init_timeout = init_timeout;
  return ddp::init(thread_env(rank, world), std::move(store), options);
}

// World size 1 on its own memory store.
inline ddp::Context nccl_world_of_one() {
  return nccl_context(std::make_shared<ddp::store::MemoryStore>(), 0, 1,
                      ddp::test::build_timeout(std::chrono::seconds(60)));
}

}  // namespace ddp::test
