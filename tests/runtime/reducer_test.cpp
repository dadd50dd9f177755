// ddp::Reducer: ranks as threads over a MemoryStore, Gloo on loopback.
#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <numeric>
#include <optional>
#include <random>

#include "ddp/runtime.hpp"
#include "thread_world.hpp"

using ddp::Context;
using ddp::Reducer;

namespace {

constexpr int kWorld = 3;

// Parameters backed by vectors the test owns.
struct Model {
  std::vector<std::vector<float>> storage;
  std::vector<ddp::Parameter> parameters() {
    std::vector<ddp::Parameter> out;
    for (std::size_t i = 0; i < storage.size(); ++i) {
      out.push_back({"layer" + std::to_string(i), std::span<float>(storage[i])});
    }
    return out;
  }
};

Model make_model(const std::vector<std::size_t>& sizes, float value) {
  Model model;
  for (auto n : sizes) model.storage.emplace_back(n, value);
  return model;
}

// A value whose sums over a few ranks are exact in fp32: any reduction order gives the same
// bits, so results can be compared bit for bit.
float exact_value(std::mt19937& rng) {
  return static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 256.0f;
}

}  // namespace

TEST_CASE("plan_buckets: reverse order, a small first bucket, no gradient split") {
  const std::size_t mb = 1u << 18;  // floats per MiB
  const std::vector<std::size_t> sizes = {mb, 3 * mb, mb / 2, mb / 4, mb / 4, 30 * mb, 2};
  const auto buckets = Reducer::plan_buckets(sizes, 1.0, 2.0);
  // Bucket 0 starts with the last gradient and closes once it holds >= 1 MiB (a 30 MiB
  // gradient is not split); later buckets close at >= 2 MiB.
  REQUIRE(buckets.size() == 3);
  CHECK(buckets[0].parameters == std::vector<std::size_t>{6, 5});
  CHECK(buckets[1].parameters == std::vector<std::size_t>{4, 3, 2, 1});
  CHECK(buckets[1].elements == 4 * mb);
  CHECK(buckets[2].parameters == std::vector<std::size_t>{0});
  CHECK(Reducer::plan_buckets(sizes, 1.0, 25.0).size() == 2);
  std::vector<std::size_t> seen;
  for (const auto& b : buckets) seen.insert(seen.end(), b.parameters.begin(), b.parameters.end());
  std::sort(seen.begin(), seen.end());
  CHECK(seen == std::vector<std::size_t>{0, 1, 2, 3, 4, 5, 6});
  // Tiny caps: one gradient per bucket.
  CHECK(Reducer::plan_buckets(sizes, 0.0, 0.0).size() == sizes.size());
  CHECK(Reducer::plan_buckets({}, 1.0, 25.0).empty());
}

TEST_CASE("the Reducer matches one all-reduce of everything bit for bit, any ready order") {
  for (unsigned trial = 0; trial < 4; ++trial) {
    std::mt19937 shape_rng(trial);
    std::vector<std::size_t> sizes(5 + shape_rng() % 30);
    for (auto& n : sizes) n = shape_rng() % 3 == 0 ? shape_rng() % 20 : shape_rng() % 40000;
    ddp::ReducerOptions options;
    options.first_bucket_mb = 0.01 * (1 + trial);
    options.bucket_cap_mb = 0.05 * (1 + trial);
    ddp::InitOptions init;
    init.shared_memory = trial % 2 == 0;  // shared memory and TCP both
    ddp::test::run_world(
        kWorld,
        [&](Context& ctx) {
          Model model = make_model(sizes, 0.0f);
          Reducer reducer(ctx, model.parameters(), options);
          std::mt19937 rng(1000 * trial + ctx.rank());
          for (int step = 0; step < 2; ++step) {
            std::vector<float> everything;
            for (std::size_t i = 0; i < sizes.size(); ++i) {
              for (float& g : reducer.grad(i)) everything.push_back(g = exact_value(rng));
            }
            std::vector<std::size_t> order(sizes.size());
            std::iota(order.begin(), order.end(), 0);
            std::shuffle(order.begin(), order.end(), rng);  // a different order on every rank
            for (auto i : order) reducer.mark_ready(i);
            reducer.finalize();
            ctx.allreduce(std::span<float>(everything), ddp::ReduceOp::Avg);
            std::size_t k = 0;
            for (std::size_t i = 0; i < sizes.size(); ++i) {
              for (float g : reducer.grad(i)) RANK_REQUIRE(g == everything[k++]);
            }
          }
        },
        init);
  }
}

TEST_CASE("an early bucket's all-reduce completes before the last gradient is marked") {
  const std::size_t n = 100000;  // 0.38 MiB each: with 0.5 MiB caps, two gradients per bucket
  ddp::ReducerOptions options;
  options.first_bucket_mb = 0.5;
  options.bucket_cap_mb = 0.5;
  ddp::test::run_world(kWorld, [&](Context& ctx) {
    Model model = make_model({n, n, n, n}, 0.0f);
    Reducer reducer(ctx, model.parameters(), options);
    RANK_REQUIRE(reducer.buckets().size() == 2);
    for (std::size_t i = 0; i < 4; ++i) std::fill_n(reducer.grad(i).begin(), n, 3.0f * ctx.rank());
    reducer.mark_ready(3);
    reducer.mark_ready(2);   // bucket 0 complete: its all-reduce starts now
    reducer.wait_bucket(0);  // ... and finishes while gradients 0 and 1 are still pending
    const auto before_last = std::chrono::steady_clock::now();
    RANK_REQUIRE(reducer.grad(2)[0] == 3.0f);  // (0 + 3 + 6) / 3, already averaged
    reducer.mark_ready(1);
    reducer.mark_ready(0);
    reducer.finalize();
    const auto& timings = reducer.timings();
    RANK_REQUIRE(timings[0].launched < before_last);
    RANK_REQUIRE(timings[0].completed <= before_last);
    RANK_REQUIRE(timings[1].launched > before_last);
    RANK_REQUIRE(reducer.grad(0)[n - 1] == 3.0f);
  });
}

TEST_CASE("parameters are broadcast from rank 0 at construction") {
  ddp::test::run_world(kWorld, [](Context& ctx) {
    Model model = make_model({10, 1, 0, 7}, 1.0f + ctx.rank());
    Reducer reducer(ctx, model.parameters());
    for (const auto& p : model.storage) {
      for (float v : p) RANK_REQUIRE(v == 1.0f);
    }
    for (std::size_t i = 0; i < reducer.size(); ++i) {
      for (float g : reducer.grad(i)) RANK_REQUIRE(g == 0.0f);  // gradients start zeroed
    }
  });
}

TEST_CASE("no_sync accumulates locally, the next synced step averages the sum") {
  ddp::test::run_world(kWorld, [](Context& ctx) {
    Model model = make_model({5, 300}, 0.0f);
    Reducer reducer(ctx, model.parameters());
    auto add = [&](float x) {
      for (std::size_t i = 0; i < reducer.size(); ++i) {
        for (float& g : reducer.grad(i)) g += x;
      }
    };
    {
      auto guard = reducer.no_sync();
      add(static_cast<float>(ctx.rank()));  // micro-batch 1: local only
      reducer.mark_ready(1);
      reducer.mark_ready(0);
      reducer.finalize();
      RANK_REQUIRE(reducer.grad(0)[0] == static_cast<float>(ctx.rank()));
    }
    add(static_cast<float>(ctx.rank()));  // micro-batch 2: synced
    reducer.mark_ready(0);
    reducer.mark_ready(1);
    reducer.finalize();
    RANK_REQUIRE(reducer.grad(1)[299] == 2.0f);  // mean of 2 * {0, 1, 2}
    reducer.zero_grad();
    RANK_REQUIRE(reducer.grad(1)[299] == 0.0f);
  });
}

TEST_CASE("bf16 compression reduces representable values exactly") {
  ddp::ReducerOptions options;
  options.compression = ddp::DType::BF16;
  ddp::test::run_world(kWorld, [&](Context& ctx) {
    Model model = make_model({1000, 17}, 0.0f);
    Reducer reducer(ctx, model.parameters(), options);
    for (std::size_t i = 0; i < 2; ++i) {
      std::fill_n(reducer.grad(i).begin(), reducer.grad(i).size(), 1.5f * (ctx.rank() + 1));
    }
    reducer.mark_ready(0);
    reducer.mark_ready(1);
    reducer.finalize();
    RANK_REQUIRE(reducer.grad(0)[999] == 3.0f);
    RANK_REQUIRE(reducer.grad(1)[16] == 3.0f);
  });
}

TEST_CASE("misuse: a gradient marked twice is named") {
  ddp::test::run_world(1, [](Context& ctx) {
    Model model = make_model({4, 4}, 0.0f);
    Reducer reducer(ctx, model.parameters());
    reducer.mark_ready(1);
    RANK_REQUIRE_THROWS_CONTAINING(reducer.mark_ready(1),
                                   "'layer1' (index 1) was marked ready twice");
    RANK_REQUIRE_THROWS_AS(reducer.mark_ready(2), ddp::ReducerError);
  });
}

TEST_CASE("misuse: finalize lists the gradients never marked") {
  ddp::test::run_world(1, [](Context& ctx) {
    Model model = make_model({4, 4, 4}, 0.0f);
    Reducer reducer(ctx, model.parameters());
    reducer.mark_ready(1);
    try {
      reducer.finalize();
      FAIL("finalize accepted unmarked gradients");
    } catch (const ddp::ReducerError& e) {
      const std::string what = e.what();
      RANK_REQUIRE(what.find("2 gradients never marked") != std::string::npos);
      RANK_REQUIRE(what.find("'layer0'") != std::string::npos);
      RANK_REQUIRE(what.find("'layer2'") != std::string::npos);
      RANK_REQUIRE(what.find("'layer1'") == std::string::npos);
    }
    // The step was reset: a complete step works afterwards.
    for (std::size_t i = 0; i < 3; ++i) reducer.mark_ready(i);
    reducer.finalize();
  });
}

TEST_CASE("misuse: a different layout on one rank fails on every rank with both views") {
  std::atomic<int> failures{0};
  ddp::test::run_world(kWorld, [&](Context& ctx) {
    Model model = make_model(
        ctx.rank() == 2 ? std::vector<std::size_t>{4, 5} : std::vector<std::size_t>{4, 4}, 0.0f);
    try {
      Reducer reducer(ctx, model.parameters());
    } catch (const ddp::ReducerError& e) {
      const std::string what = e.what();
      RANK_REQUIRE(what.find("2 gradients [4,5]") != std::string::npos);
      RANK_REQUIRE(what.find("2 gradients [4,4]") != std::string::npos);
      failures.fetch_add(1);
    }
  });
  REQUIRE(failures.load() == kWorld);
}

// A communicator whose all-reduces the test scripts: a synchronous throw, or a Work that
// fails, per call. Everything else completes at once.
namespace {

struct ScriptedWork : ddp::detail::WorkState {
  std::exception_ptr error;
  bool waited = false;
  bool wait_for(std::chrono::milliseconds) override {
    waited = true;
    if (error) std::rethrow_exception(error);
    return true;
  }
  bool done() override { return true; }
  std::string describe() const override { return "scripted allreduce"; }
};

struct ScriptedComm : ddp::Communicator {
  ddp::Backend kind = ddp::Backend::Gloo;
  std::vector<std::string> script;  // per allreduce call: "ok", "fail" (Work), "throw" (call)
  std::vector<std::shared_ptr<ScriptedWork>> issued;
  std::vector<std::optional<ddp::DType>> wires;  // per allreduce call: its wire type
  std::size_t calls = 0;

  ddp::Backend backend() const override { return kind; }
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  ddp::Work allreduce(void*, std::size_t, ddp::DType, ddp::ReduceOp,
                      const ddp::CollectiveOptions& options) override {
    wires.push_back(options.wire_dtype);
    const std::string what = calls < script.size() ? script[calls] : "ok";
    ++calls;
    if (what == "throw") throw ddp::Unsupported("scripted synchronous failure");
    auto work = std::make_shared<ScriptedWork>();
    if (what == "fail") work->error = std::make_exception_ptr(ddp::CommError("scripted failure"));
    issued.push_back(work);
    return ddp::Work(work);
  }
  ddp::Work broadcast(void*, std::size_t, ddp::DType, int, const ddp::CollectiveOptions&) override {
    return {};
  }
  ddp::Work allgather(const void*, void*, std::size_t, ddp::DType,
                      const ddp::CollectiveOptions&) override {
    return {};
  }
  ddp::Work reduce_scatter(const void*, void*, std::size_t, ddp::DType, ddp::ReduceOp,
                           const ddp::CollectiveOptions&) override {
    return {};
  }
  ddp::Work barrier() override { return {}; }
  std::shared_ptr<void> allocate(std::size_t bytes) override {
    auto owner = std::make_shared<std::vector<float>>(bytes / sizeof(float) + 1);
    return std::shared_ptr<void>(owner, owner->data());
  }
  void fill_zero(void* data, std::size_t bytes, void*) override { std::memset(data, 0, bytes); }
  void set_mismatch_check(ddp::MismatchCheck) override {}
  void abort(const std::string&) override {}  // the Reducer never aborts
};

Context scripted_context(std::unique_ptr<ScriptedComm> comm) {
  return Context(ddp::test::thread_env(0, 1), std::make_shared<ddp::store::MemoryStore>(),
                 std::move(comm), std::chrono::seconds(5));
}

ddp::ReducerOptions one_gradient_per_bucket() {
  ddp::ReducerOptions options;
  options.first_bucket_mb = 0.0;
  options.bucket_cap_mb = 0.0;
  return options;
}

}  // namespace

TEST_CASE(
    "a failed bucket surfaces in finalize after every bucket ended, and the next step is clean") {
  auto owned = std::make_unique<ScriptedComm>();
  ScriptedComm& comm = *owned;
  comm.script = {"fail", "ok"};  // bucket 0 fails, bucket 1 is still in flight
  Context ctx = scripted_context(std::move(owned));
  Model model = make_model({4, 4}, 0.0f);
  Reducer reducer(ctx, model.parameters(), one_gradient_per_bucket());
  REQUIRE(reducer.buckets().size() == 2);
  reducer.mark_ready(1);
  reducer.mark_ready(0);
  REQUIRE_THROWS_WITH(reducer.finalize(), Catch::Contains("scripted failure"));
  REQUIRE(comm.issued.size() == 2);
  CHECK(comm.issued[1]->waited);  // finalize did not leave bucket 1 in flight
  // The failed step was reset: the next one is not refused as "marked twice".
  reducer.mark_ready(1);
  reducer.mark_ready(0);
  reducer.finalize();
}

TEST_CASE("an all-reduce that throws when issued leaves its bucket unreduced: finalize fails") {
  auto owned = std::make_unique<ScriptedComm>();
  owned->script = {"throw", "throw"};
  Context ctx = scripted_context(std::move(owned));
  Model model = make_model({4}, 0.0f);
  Reducer reducer(ctx, model.parameters(), one_gradient_per_bucket());
  REQUIRE_THROWS_AS(reducer.mark_ready(0), ddp::Unsupported);
  // The bucket never started: finalize must not report averaged gradients.
  REQUIRE_THROWS_AS(reducer.finalize(), ddp::Unsupported);
}

TEST_CASE("misuse: wait_bucket of a bucket that does not exist is a ReducerError") {
  ddp::test::run_world(1, [](Context& ctx) {
    Model model = make_model({4, 4}, 0.0f);
    Reducer reducer(ctx, model.parameters());
    RANK_REQUIRE_THROWS_AS(reducer.wait_bucket(7), ddp::ReducerError);
  });
}

#if defined(DDP_HAVE_CUDA_KERNELS)
TEST_CASE("compression on nccl hands the wire type to every bucket's all-reduce") {
  auto owned = std::make_unique<ScriptedComm>();
  owned->kind = ddp::Backend::Nccl;
  ScriptedComm& comm = *owned;
  Context ctx = scripted_context(std::move(owned));
  Model model = make_model({4, 4}, 0.0f);
  ddp::ReducerOptions options = one_gradient_per_bucket();
  options.compression = ddp::DType::F16;
  Reducer reducer(ctx, model.parameters(), options);
  reducer.mark_ready(1);
  reducer.mark_ready(0);
  reducer.finalize();
  REQUIRE(comm.wires.size() == 2);
  for (const auto& wire : comm.wires) REQUIRE(wire == ddp::DType::F16);
}
#else
TEST_CASE("misuse: compression on nccl without CUDA kernels fails at construction") {
  auto owned = std::make_unique<ScriptedComm>();
  owned->kind = ddp::Backend::Nccl;
  Context ctx = scripted_context(std::move(owned));
  Model model = make_model({4}, 0.0f);
  ddp::ReducerOptions options;
  options.compression = ddp::DType::BF16;
  REQUIRE_THROWS_WITH(Reducer(ctx, model.parameters(), options), Catch::Contains("nccl"));
}
#endif

TEST_CASE("misuse: compression on some ranks only fails at construction on every rank") {
  std::atomic<int> failures{0};
  ddp::test::run_world(2, [&](Context& ctx) {
    ddp::ReducerOptions options;
    if (ctx.rank() == 1) options.compression = ddp::DType::BF16;
    Model model = make_model({4, 4}, 0.0f);
    try {
      Reducer reducer(ctx, model.parameters(), options);
    } catch (const ddp::ReducerError& e) {
      const std::string what = e.what();
      RANK_REQUIRE(what.find("bf16") != std::string::npos);
      RANK_REQUIRE(what.find("f32") != std::string::npos);
      failures.fetch_add(1);
    }
  });
  REQUIRE(failures.load() == 2);
}

TEST_CASE("misuse: zero_grad while this step's all-reduces are in flight is refused") {
  ddp::test::run_world(1, [](Context& ctx) {
    Model model = make_model({4, 4}, 0.0f);
    Reducer reducer(ctx, model.parameters(), one_gradient_per_bucket());
    reducer.mark_ready(1);  // bucket 0 starts: its buffer belongs to the communicator
    RANK_REQUIRE_THROWS_CONTAINING(reducer.zero_grad(), "finalize()");
    reducer.mark_ready(0);
    reducer.finalize();
    reducer.zero_grad();    // between steps: fine
    reducer.mark_ready(0);  // gradient 0 is in the last bucket, which has not started
    reducer.zero_grad();    // nothing in flight yet: fine
    reducer.mark_ready(1);
    reducer.finalize();
  });
}
