#pragma once
// Ranks as threads over one MemoryStore: the fast way to run a whole world in a test.

#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "ddp/context.hpp"
#include "ddp/store/memory_store.hpp"

namespace ddp::test {

inline LaunchEnv thread_env(int rank, int world_size) {
  LaunchEnv env;
  env.rank = rank;
  env.world_size = world_size;
  env.local_rank = rank;
  env.local_world_size = world_size;
  env.master_addr = "127.0.0.1";
  return env;
}

// Runs body(context) on world_size threads, each with its own Context built over a shared
// MemoryStore, and rethrows the first failure after all threads ended.
inline void run_world(int world_size, const std::function<void(Context&)>& body,
                      InitOptions options = {}) {
  options.backend = Backend::Gloo;
  options.init_timeout = std::chrono::seconds(30);
  options.timeout = std::chrono::seconds(30);
  auto store = std::make_shared<store::MemoryStore>();
  std::mutex mutex;
  std::exception_ptr first;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world_size; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        Context context = init(thread_env(rank, world_size), store, options);
        body(context);
      } catch (...) {
        std::lock_guard lock(mutex);
        if (!first) first = std::current_exception();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  if (first) std::rethrow_exception(first);
}

}  // namespace ddp::test
