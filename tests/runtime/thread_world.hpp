#pragma once
// Ranks as threads over one MemoryStore: the fast way to run a whole world in a test.

#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ddp/context.hpp"
#include "ddp/store/memory_store.hpp"

namespace ddp::test {

// A failed expectation on a rank thread. Catch2 v2's assertions are not thread-safe, so rank
// threads never assert: they throw this (RANK_REQUIRE below), run_world rethrows it on the
// test's thread, and Catch reports it there with the expression and its place.
class RankFailure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

inline void rank_require(bool ok, const char* expression, const char* file, int line) {
  if (!ok) {
    throw RankFailure(std::string(file) + ":" + std::to_string(line) + ": RANK_REQUIRE(" +
                      expression + ") failed");
  }
}

}  // namespace ddp::test

// REQUIRE for rank threads: throws RankFailure when the condition is false.
#define RANK_REQUIRE(...) \
  ::ddp::test::rank_require(static_cast<bool>(__VA_ARGS__), #__VA_ARGS__, __FILE__, __LINE__)

// REQUIRE_THROWS_AS for rank threads.
#define RANK_REQUIRE_THROWS_AS(expression, type)                                          \
  do {                                                                                    \
    bool thrown_ = false;                                                                 \
    try {                                                                                 \
      static_cast<void>(expression);                                                      \
    } catch (const type&) {                                                               \
      thrown_ = true;                                                                     \
    }                                                                                     \
    ::ddp::test::rank_require(thrown_, #expression " throws " #type, __FILE__, __LINE__); \
  } while (false)

// REQUIRE_THROWS_WITH(expression, Catch::Contains(text)) for rank threads.
#define RANK_REQUIRE_THROWS_CONTAINING(expression, text)                                  \
  do {                                                                                    \
    std::string what_;                                                                    \
    try {                                                                                 \
      static_cast<void>(expression);                                                      \
    } catch (const std::exception& e_) {                                                  \
      what_ = e_.what();                                                                  \
    }                                                                                     \
    ::ddp::test::rank_require(what_.find(text) != std::string::npos,                      \
                              #expression " throws an error containing " #text, __FILE__, \
                              __LINE__);                                                  \
  } while (false)

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
// MemoryStore, and rethrows the first failure after all threads ended. The body checks
// with RANK_REQUIRE, never with Catch's macros.
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
