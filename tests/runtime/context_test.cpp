// Collectives through Context: ranks as threads over a MemoryStore, Gloo on loopback.
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <filesystem>
#include <mutex>
#include <numeric>
#include <thread>

#include "ddp/runtime.hpp"
#include "thread_world.hpp"

using ddp::Context;
using ddp::ReduceOp;

namespace {

constexpr int kWorld = 3;

template <typename T>
T value_for(int rank, std::size_t i) {
  return static_cast<T>(static_cast<int>((i % 7) + 1) * (rank + 1));
}

template <typename T>
void check_allreduce(Context& ctx, std::size_t count) {
  std::vector<T> sum(count), avg(count), mn(count), mx(count);
  for (std::size_t i = 0; i < count; ++i) {
    sum[i] = avg[i] = mn[i] = mx[i] = value_for<T>(ctx.rank(), i);
  }
  ctx.allreduce(std::span<T>(sum), ReduceOp::Sum);
  ctx.allreduce(std::span<T>(avg), ReduceOp::Avg);
  ctx.allreduce(std::span<T>(mn), ReduceOp::Min);
  ctx.allreduce(std::span<T>(mx), ReduceOp::Max);
  const int ranks_sum = kWorld * (kWorld + 1) / 2;  // 1 + 2 + 3
  for (std::size_t i = 0; i < count; ++i) {
    const int base = static_cast<int>(i % 7) + 1;
    RANK_REQUIRE(sum[i] == static_cast<T>(base * ranks_sum));
    RANK_REQUIRE(avg[i] ==
                 static_cast<T>(static_cast<T>(base * ranks_sum) / static_cast<T>(kWorld)));
    RANK_REQUIRE(mn[i] == static_cast<T>(base));
    RANK_REQUIRE(mx[i] == static_cast<T>(base * kWorld));
  }
}

}  // namespace

TEST_CASE("allreduce: every op and dtype over sizes 0, 1, odd and 4099") {
  for (bool shared_memory : {true, false}) {
    INFO("shared memory: " << shared_memory);
    ddp::InitOptions options;
    options.shared_memory = shared_memory;
    ddp::test::run_world(
        kWorld,
        [](Context& ctx) {
          for (std::size_t count : {0u, 1u, 7u, 4099u}) {
            check_allreduce<float>(ctx, count);
            check_allreduce<double>(ctx, count);
            check_allreduce<std::int32_t>(ctx, count);
            check_allreduce<std::int64_t>(ctx, count);
          }
        },
        options);
  }
}

TEST_CASE("allreduce through shared memory: several chunks, uneven shares") {
  // 4 MiB slots hold 1 Mi floats: 2.5 chunks, and shares that do not divide evenly.
  ddp::test::run_world(kWorld, [](Context& ctx) {
    const std::size_t n = (1u << 20) * 5 / 2 + 13;
    std::vector<float> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>((i % 1000) * (ctx.rank() + 1));
    ctx.allreduce(std::span<float>(v), ReduceOp::Sum);
    for (std::size_t i = 0; i < n; ++i) RANK_REQUIRE(v[i] == static_cast<float>((i % 1000) * 6));
  });
}

TEST_CASE("allreduce: 16M floats once, over TCP") {
  ddp::InitOptions options;
  options.shared_memory = false;
  ddp::test::run_world(
      kWorld,
      [](Context& ctx) {
        std::vector<float> v(16u << 20, static_cast<float>(ctx.rank() + 1));
        ctx.allreduce(std::span<float>(v), ReduceOp::Sum);
        RANK_REQUIRE(v.front() == 6.0f);
        RANK_REQUIRE(v[v.size() / 2] == 6.0f);
        RANK_REQUIRE(v.back() == 6.0f);
        RANK_REQUIRE(std::count(v.begin(), v.end(), 6.0f) == static_cast<std::ptrdiff_t>(v.size()));
      },
      options);
}

TEST_CASE("allreduce: 16-bit floats sum in float and round once per step") {
  ddp::test::run_world(kWorld, [](Context& ctx) {
    std::vector<ddp::bfloat16> b(33, ddp::to_bfloat16(0.5f * (ctx.rank() + 1)));
    std::vector<ddp::float16> h(33, ddp::to_float16(0.25f * (ctx.rank() + 1)));
    ctx.allreduce(std::span<ddp::bfloat16>(b), ReduceOp::Sum);
    ctx.allreduce(std::span<ddp::float16>(h), ReduceOp::Max);
    for (auto v : b) RANK_REQUIRE(ddp::to_float(v) == 3.0f);
    for (auto v : h) RANK_REQUIRE(ddp::to_float(v) == 0.75f);
  });
}

TEST_CASE("broadcast from every root, including size 0") {
  ddp::test::run_world(kWorld, [](Context& ctx) {
    for (int root = 0; root < kWorld; ++root) {
      std::vector<std::int64_t> v(1001, ctx.rank() == root ? 100 + root : -1);
      ctx.broadcast(std::span<std::int64_t>(v), root);
      RANK_REQUIRE(std::count(v.begin(), v.end(), 100 + root) == 1001);
      std::vector<double> empty;
      ctx.broadcast(std::span<double>(empty), root);
    }
  });
}

TEST_CASE("allgather places rank r's input at r * count") {
  ddp::test::run_world(kWorld, [](Context& ctx) {
    for (std::size_t count : {0u, 1u, 5u, 1000u}) {
      std::vector<std::int32_t> in(count, ctx.rank() * 10);
      std::vector<std::int32_t> out(count * kWorld, -1);
      ctx.allgather(std::span<const std::int32_t>(in), std::span<std::int32_t>(out));
      for (int r = 0; r < kWorld; ++r) {
        for (std::size_t i = 0; i < count; ++i) RANK_REQUIRE(out[r * count + i] == r * 10);
      }
    }
  });
}

TEST_CASE("reduce_scatter gives each rank its reduced slice") {
  ddp::test::run_world(kWorld, [](Context& ctx) {
    for (std::size_t count : {0u, 1u, 9u}) {
      std::vector<float> in(count * kWorld);
      for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i);
      std::vector<float> out(count, -1.0f);
      ctx.reduce_scatter(std::span<float>(in), std::span<float>(out), ReduceOp::Sum);
      for (std::size_t i = 0; i < count; ++i) {
        RANK_REQUIRE(out[i] == 3.0f * static_cast<float>(ctx.rank() * count + i));
      }
    }
  });
}

TEST_CASE("barrier: nobody leaves before everybody arrived") {
  std::atomic<int> arrived{0};
  ddp::test::run_world(kWorld, [&](Context& ctx) {
    arrived.fetch_add(1);
    ctx.barrier();
    RANK_REQUIRE(arrived.load() == kWorld);
  });
}

TEST_CASE("async collectives complete in issue order and overlap the caller") {
  ddp::test::run_world(kWorld, [](Context& ctx) {
    std::vector<std::vector<float>> buffers(8, std::vector<float>(10000, 1.0f));
    std::vector<ddp::Work> works;
    for (auto& b : buffers) works.push_back(ctx.allreduce_async(std::span<float>(b)));
    for (auto& w : works) w.wait();
    for (auto& b : buffers) RANK_REQUIRE(b[9999] == 3.0f);
    RANK_REQUIRE(works.back().completed());
  });
}

TEST_CASE("a mismatched first call is reported with every rank's view") {
  std::atomic<int> mismatches{0};
  ddp::test::run_world(kWorld, [&](Context& ctx) {
    std::vector<float> v(ctx.rank() == 1 ? 10 : 12, 1.0f);
    try {
      ctx.allreduce(std::span<float>(v));
    } catch (const ddp::CollectiveMismatch& e) {
      const std::string what = e.what();
      RANK_REQUIRE(what.find("rank 0: allreduce(sum, f32 x 12)") != std::string::npos);
      RANK_REQUIRE(what.find("rank 1: allreduce(sum, f32 x 10)") != std::string::npos);
      mismatches.fetch_add(1);
    }
  });
  REQUIRE(mismatches.load() == kWorld);
}

TEST_CASE("with the check on every call, a later dtype mismatch is caught too") {
  ddp::InitOptions options;
  options.mismatch_check = ddp::MismatchCheck::Always;
  std::atomic<int> mismatches{0};
  ddp::test::run_world(
      kWorld,
      [&](Context& ctx) {
        std::vector<float> f(4, 1.0f);
        ctx.allreduce(std::span<float>(f));
        std::vector<double> d(4, 1.0);
        try {
          if (ctx.rank() == 2)
            ctx.allreduce(std::span<float>(f));
          else
            ctx.allreduce(std::span<double>(d));
        } catch (const ddp::CollectiveMismatch& e) {
          RANK_REQUIRE(std::string(e.what()).find("rank 2: allreduce(sum, f32 x 4)") !=
                       std::string::npos);
          mismatches.fetch_add(1);
        }
      },
      options);
  REQUIRE(mismatches.load() == kWorld);
}

TEST_CASE("allgather with a wrong output size is refused before any communication") {
  ddp::test::run_world(1, [](Context& ctx) {
    std::vector<float> in(3), out(4);
    RANK_REQUIRE_THROWS_AS(ctx.allgather(std::span<float>(in), std::span<float>(out)),
                           ddp::CommError);
  });
}

TEST_CASE("a rank that leaves mid-job fails the survivors' next collective instead of hanging") {
  const bool shared_memory = GENERATE(false, true);
  INFO("shared memory: " << shared_memory);
  ddp::InitOptions options;
  options.backend = ddp::Backend::Gloo;
  options.init_timeout = std::chrono::seconds(30);
  options.timeout = std::chrono::seconds(2);  // bounds the survivor's wait
  options.shared_memory = shared_memory;
  auto store = std::make_shared<ddp::store::MemoryStore>();
  std::exception_ptr leaver_error;
  std::thread leaver([&] {
    try {
      Context ctx = ddp::init(ddp::test::thread_env(1, 2), store, options);
      std::vector<float> v(1000, 1.0f);
      ctx.allreduce(std::span<float>(v));
    } catch (...) {
      leaver_error = std::current_exception();
    }
    // Leaves: the Context (its connections, its shared-memory mapping) goes away.
  });
  float first_sum = 0.0f;
  std::string survivor_what;
  try {
    Context ctx = ddp::init(ddp::test::thread_env(0, 2), store, options);
    std::vector<float> v(1000, 1.0f);
    ctx.allreduce(std::span<float>(v));
    first_sum = v[999];
    leaver.join();
    try {
      ctx.allreduce(std::span<float>(v));
    } catch (const ddp::Error& e) {
      survivor_what = e.what();
    }
  } catch (...) {
    if (leaver.joinable()) leaver.join();
    throw;
  }
  if (leaver_error) std::rethrow_exception(leaver_error);
  REQUIRE(first_sum == 2.0f);
  INFO("error: " << survivor_what);
  REQUIRE_FALSE(survivor_what.empty());
  CHECK(survivor_what.find("rank 0") != std::string::npos);
}

namespace {

// A store that fails when rank 0 publishes the shared-memory segment's name.
class FailingShmStore : public ddp::store::MemoryStore {
 public:
  void set(const std::string& key, std::string_view value) override {
    if (key.ends_with("shm/name")) throw ddp::store::StoreError("scripted: store lost");
    MemoryStore::set(key, value);
  }
};

std::size_t shm_segments_of_this_process() {
  const std::string prefix = "ddp-allreduce-" + std::to_string(::getpid()) + "-";
  std::size_t n = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
    if (entry.path().filename().string().starts_with(prefix)) ++n;
  }
  return n;
}

}  // namespace

TEST_CASE("a store failure while setting up shared memory leaves no segment in /dev/shm") {
  REQUIRE(shm_segments_of_this_process() == 0);
  ddp::InitOptions options;
  options.backend = ddp::Backend::Gloo;
  options.init_timeout = std::chrono::seconds(2);  // rank 1 waits for the name in vain
  auto store = std::make_shared<FailingShmStore>();
  std::atomic<int> failures{0};
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    ranks.emplace_back([&, rank] {
      try {
        Context ctx = ddp::init(ddp::test::thread_env(rank, 2), store, options);
      } catch (const ddp::Error&) {
        failures.fetch_add(1);
      }
    });
  }
  for (auto& t : ranks) t.join();
  REQUIRE(failures.load() == 2);
  REQUIRE(shm_segments_of_this_process() == 0);
}

TEST_CASE("a second Context in the same job builds its own mesh, not the first one's") {
  auto store = std::make_shared<ddp::store::MemoryStore>();
  ddp::InitOptions options;
  options.backend = ddp::Backend::Gloo;
  options.init_timeout = std::chrono::seconds(10);
  options.timeout = std::chrono::seconds(5);
  for (const bool shared_memory : {true, false}) {
    options.shared_memory = shared_memory;
    std::atomic<int> correct{0};
    std::mutex mutex;
    std::string errors;  // rank threads report here; the test's thread asserts
    std::vector<std::thread> ranks;
    for (int rank = 0; rank < 2; ++rank) {
      ranks.emplace_back([&, rank] {
        try {
          Context ctx = ddp::init(ddp::test::thread_env(rank, 2), store, options);
          std::vector<float> v(10, 1.0f + rank);
          ctx.allreduce(std::span<float>(v));
          if (v[9] == 3.0f) correct.fetch_add(1);
        } catch (const ddp::Error& e) {
          std::lock_guard lock(mutex);
          errors += "rank " + std::to_string(rank) + ": " + e.what() + "\n";
        }
      });
    }
    for (auto& t : ranks) t.join();
    INFO("shared memory: " << shared_memory);
    INFO(errors);
    REQUIRE(correct.load() == 2);
  }
}
