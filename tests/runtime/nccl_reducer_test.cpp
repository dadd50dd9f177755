// The Reducer and the NCCL communicator on a GPU: compression through libddp's kernels,
// stream ordering without host waits, and NCCL's init timeout. Built with CUDA kernels;
// every case skips with "no CUDA device" where none is visible.
//
// World size 1 only: one GPU cannot hold two ranks of one NCCL communicator (NCCL refuses a
// device used twice in a communicator). At world size 1 NCCL still runs every collective
// (a local copy/reduction kernel on the communication stream), so these tests cover the
// stream and event ordering, the buckets, the 16-bit kernels and the error paths, but not
// traffic between GPUs. The init-timeout case uses a second rank that never comes.
#include <cuda_runtime.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <future>
#include <thread>
#include <vector>

#include "cuda_device.hpp"
#include "ddp/runtime.hpp"
#include "ddp/store/memory_store.hpp"
#include "nccl_context.hpp"
#include "skip.hpp"
#include "test_support.hpp"

namespace {

using ddp::test::nccl_context;

using DeviceFloats = ddp::test::DeviceArray<float>;
using ddp::test::to_host;

// Values whose 16-bit rounding is exact in both f16 and bf16 (small multiples of 1/8).
std::vector<float> exact_values(std::size_t n, float offset) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = offset + static_cast<float>(i % 64) / 8.0f;
  return v;
}

}  // namespace

TEST_CASE("nccl reducer: f16 and bf16 compression leave the averaged gradients in place") {
  DDP_SKIP_WITHOUT_GPU();
  ddp::Context ctx = ddp::test::nccl_world_of_one();
  for (ddp::DType wire : {ddp::DType::F16, ddp::DType::BF16}) {
    DeviceFloats w1(std::vector<float>(1000, 0.0f)), w2(std::vector<float>(3000, 0.0f));
    ddp::ReducerOptions options;
    options.compression = wire;
    options.first_bucket_mb = 0.0;  // one gradient per bucket: two compressed all-reduces
    options.bucket_cap_mb = 0.0;
    ddp::Reducer reducer(ctx, {{"w1", w1.span()}, {"w2", w2.span()}}, options);
    REQUIRE(reducer.buckets().size() == 2);
    const auto g1 = exact_values(1000, -2.0f), g2 = exact_values(3000, 1.0f);
    REQUIRE(cudaMemcpy(reducer.grad(0).data(), g1.data(), 1000 * sizeof(float),
                       cudaMemcpyHostToDevice) == cudaSuccess);
    REQUIRE(cudaMemcpy(reducer.grad(1).data(), g2.data(), 3000 * sizeof(float),
                       cudaMemcpyHostToDevice) == cudaSuccess);
    reducer.mark_ready(1);
    reducer.mark_ready(0);
    reducer.finalize();
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    // World size 1: the average is the value itself, exactly representable in 16 bits.
    CHECK(to_host(reducer.grad(0)) == g1);
    CHECK(to_host(reducer.grad(1)) == g2);
  }
}

TEST_CASE("nccl reducer: compression rounds to the wire type, to nearest") {
  DDP_SKIP_WITHOUT_GPU();
  ddp::Context ctx = ddp::test::nccl_world_of_one();
  const std::vector<float> values = {1.0f + 1.0f / 1024.0f, 3.14159265f, -1e-3f, 65504.0f};
  for (ddp::DType wire : {ddp::DType::F16, ddp::DType::BF16}) {
    DeviceFloats data(values);
    ddp::CollectiveOptions options;
    options.wire_dtype = wire;
    ctx.communicator()
        .allreduce(data.data, values.size(), ddp::DType::F32, ddp::ReduceOp::Avg, options)
        .wait(ddp::test::build_timeout(std::chrono::seconds(60)));
    const auto out = to_host(data.span());
    for (std::size_t i = 0; i < values.size(); ++i) {
      const float expected = wire == ddp::DType::F16 ? ddp::to_float(ddp::to_float16(values[i]))
                                                     : ddp::to_float(ddp::to_bfloat16(values[i]));
      INFO("wire " << ddp::to_string(wire) << ", value " << values[i]);
      CHECK(out[i] == expected);
    }
  }
}

TEST_CASE("nccl reducer: compressed buckets are queued while backward runs, no host wait") {
  DDP_SKIP_WITHOUT_GPU();
  ddp::Context ctx = ddp::test::nccl_world_of_one();
  const std::size_t n = 1 << 20;
  DeviceFloats params(std::vector<float>(2 * n, 0.0f));
  cudaStream_t compute = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking) == cudaSuccess);
  ddp::ReducerOptions options;
  options.compute_stream = compute;
  options.compression = ddp::DType::BF16;
  options.first_bucket_mb = 4;
  options.bucket_cap_mb = 4;
  ddp::Reducer reducer(ctx, {{"a", {params.data, n}}, {"b", {params.data + n, n}}}, options);
  REQUIRE(reducer.buckets().size() == 2);
  // "Backward": a long queue of device copies on the compute stream, then the gradients,
  // copied device to device (set up first: nothing below may make the host wait).
  DeviceFloats ones(std::vector<float>(n, 1.0f));
  void* scratch = nullptr;
  const std::size_t scratch_bytes = 256u << 20;
  REQUIRE(cudaMalloc(&scratch, 2 * scratch_bytes) == cudaSuccess);
  cudaEvent_t backward_done = nullptr;
  REQUIRE(cudaEventCreate(&backward_done) == cudaSuccess);
  for (int k = 0; k < 200; ++k) {
    REQUIRE(cudaMemcpyAsync(static_cast<char*>(scratch) + scratch_bytes, scratch, scratch_bytes,
                            cudaMemcpyDeviceToDevice, compute) == cudaSuccess);
  }
  for (std::size_t i = 2; i-- > 0;) {
    REQUIRE(cudaMemcpyAsync(reducer.grad(i).data(), ones.data, n * sizeof(float),
                            cudaMemcpyDeviceToDevice, compute) == cudaSuccess);
    reducer.mark_ready(i);
  }
  REQUIRE(cudaEventRecord(backward_done, compute) == cudaSuccess);
  CHECK(cudaEventQuery(backward_done) == cudaErrorNotReady);  // the host never waited
  reducer.finalize();
  // A copy queued on the compute stream after finalize sees the averaged values.
  std::vector<float> after(n, 0.0f);
  REQUIRE(cudaMemcpyAsync(after.data(), reducer.grad(0).data(), n * sizeof(float),
                          cudaMemcpyDeviceToHost, compute) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(compute) == cudaSuccess);
  CHECK(after[0] == 1.0f);
  CHECK(after[n - 1] == 1.0f);
  cudaFree(scratch);
  cudaEventDestroy(backward_done);
  cudaStreamDestroy(compute);
}

TEST_CASE("nccl init: a rank that never calls NCCL's init is named after the init timeout") {
  DDP_SKIP_WITHOUT_GPU();
  auto store = std::make_shared<ddp::store::MemoryStore>();
  // Rank 1 of 2 "arrives" in the store but never calls NCCL's init (a worker stuck before
  // it): rank 0's non-blocking init cannot complete and must be aborted at the deadline.
  store->set("ddp/attempt_0/nccl/1/arrived/1", "1");
  const auto start = std::chrono::steady_clock::now();
  try {
    nccl_context(store, 0, 2, std::chrono::seconds(3));
    FAIL("init of a 2-rank communicator with one rank completed");
  } catch (const ddp::InitError& e) {
    const std::string message = e.what();
    INFO(message);
    CHECK(message.find("NCCL init timed out after 3000 ms") != std::string::npos);
    CHECK(message.find("never called NCCL's init: 1") != std::string::npos);
  }
  // Bounded by the timeout (plus the abort), not by NCCL's own waits; the abort takes longer
  // under compute-sanitizer (scripts/gpu-check sets DDP_TEST_TIME_FACTOR).
  CHECK(std::chrono::steady_clock::now() - start <
        ddp::test::build_timeout(std::chrono::seconds(30)));
}

TEST_CASE("nccl init: a rank that never arrives is named, before NCCL is called") {
  DDP_SKIP_WITHOUT_GPU();
  try {
    nccl_context(std::make_shared<ddp::store::MemoryStore>(), 0, 3, std::chrono::seconds(1));
    FAIL("init of a 3-rank communicator with one rank completed");
  } catch (const ddp::InitError& e) {
    const std::string message = e.what();
    INFO(message);
    CHECK(message.find("2 ranks never arrived: 1, 2") != std::string::npos);
  }
}

// Issue 24: finalize() only orders the compute stream after the all-reduces, so an abort can
// cut them short after it returned. The Reducer's guard then leaves NaN for whatever the
// stream runs next (the optimizer step, a checkpoint copy), and aborted() says so.
TEST_CASE("nccl reducer: after an abort the compute stream sees NaN gradients, never garbage") {
  DDP_SKIP_WITHOUT_GPU();
  ddp::Context ctx = ddp::test::nccl_world_of_one();
  const std::size_t n = 1024;
  DeviceFloats params(std::vector<float>(n, 0.0f));
  cudaStream_t compute = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking) == cudaSuccess);
  ddp::ReducerOptions options;
  options.compute_stream = compute;
  ddp::Reducer reducer(ctx, {{"a", {params.data, n}}}, options);
  // Hold the compute stream closed (at most 60 s): the all-reduce, ordered after it, cannot
  // finish before the abort below.
  std::promise<void> open;
  std::shared_future<void> opened = open.get_future().share();
  REQUIRE(cudaLaunchHostFunc(
              compute,
              [](void* future) {
                static_cast<std::shared_future<void>*>(future)->wait_for(std::chrono::seconds(60));
              },
              &opened) == cudaSuccess);
  reducer.mark_ready(0);
  reducer.finalize();     // orders the compute stream; the host does not wait
  float* seen = nullptr;  // pinned: a copy into pageable memory would block this thread
  REQUIRE(cudaMallocHost(reinterpret_cast<void**>(&seen), n * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaMemcpyAsync(seen, reducer.grad(0).data(), n * sizeof(float), cudaMemcpyDeviceToHost,
                          compute) == cudaSuccess);
  CHECK_FALSE(reducer.aborted());
  CHECK(reducer.abort_flag_on_device() != nullptr);
  auto aborter = std::async(std::launch::async, [&] { ctx.abort("test: a peer was lost"); });
  const auto start = std::chrono::steady_clock::now();
  while (!reducer.aborted() &&
         std::chrono::steady_clock::now() - start < std::chrono::seconds(30)) {
    std::this_thread::yield();
  }
  CHECK(reducer.aborted());
  open.set_value();
  REQUIRE(aborter.wait_for(std::chrono::seconds(60)) == std::future_status::ready);
  aborter.get();
  REQUIRE(cudaStreamSynchronize(compute) == cudaSuccess);
  CHECK(std::all_of(seen, seen + n, [](float v) { return std::isnan(v); }));
  cudaFreeHost(seen);
  cudaStreamDestroy(compute);
}
