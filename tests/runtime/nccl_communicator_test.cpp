// The NCCL backend at world size 1 (one GPU). Built with CUDA; skips without a device.
#include <cuda_runtime.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <vector>

#include "cuda_device.hpp"
#include "ddp/runtime.hpp"
#include "ddp/store/memory_store.hpp"
#include "nccl_context.hpp"

namespace {

template <typename T>
std::vector<T> round_trip(ddp::Context& ctx, const std::vector<T>& host, ddp::ReduceOp op) {
  ddp::test::DeviceArray<T> device(host);
  ctx.allreduce(device.span(), op);
  return ddp::test::to_host(device.span());
}

}  // namespace

TEST_CASE("nccl: every dtype and op on device memory, and host memory staged") {
  DDP_SKIP_WITHOUT_GPU();
  ddp::Context ctx = ddp::test::nccl_world_of_one();
  REQUIRE(ctx.backend() == ddp::Backend::Nccl);
  for (auto op : {ddp::ReduceOp::Sum, ddp::ReduceOp::Avg, ddp::ReduceOp::Min, ddp::ReduceOp::Max}) {
    REQUIRE(round_trip(ctx, std::vector<float>(1001, 2.5f), op) == std::vector<float>(1001, 2.5f));
    REQUIRE(round_trip(ctx, std::vector<double>(7, -1.0), op) == std::vector<double>(7, -1.0));
    REQUIRE(round_trip(ctx, std::vector<std::int32_t>(3, 9), op) ==
            std::vector<std::int32_t>(3, 9));
    REQUIRE(round_trip(ctx, std::vector<std::int64_t>(0), op).empty());
    auto bf = round_trip(ctx, std::vector<ddp::bfloat16>(5, ddp::to_bfloat16(1.5f)), op);
    REQUIRE(ddp::to_float(bf[4]) == 1.5f);
    auto h = round_trip(ctx, std::vector<ddp::float16>(5, ddp::to_float16(0.75f)), op);
    REQUIRE(ddp::to_float(h[0]) == 0.75f);
  }
  std::vector<float> host(1000, 1.0f);  // the sample program's host vector
  ctx.allreduce(std::span<float>(host), ddp::ReduceOp::Sum);
  REQUIRE(host[999] == 1.0f);
  ctx.barrier();
}

TEST_CASE("nccl: bucket all-reduces are queued while backward work is still pending") {
  DDP_SKIP_WITHOUT_GPU();
  ddp::Context ctx = ddp::test::nccl_world_of_one();
  const std::size_t n = 1 << 20;
  void* params = nullptr;
  REQUIRE(cudaMalloc(&params, 4 * n * sizeof(float)) == cudaSuccess);
  std::vector<ddp::Parameter> parameters;
  for (int i = 0; i < 4; ++i) {
    parameters.push_back({"p" + std::to_string(i), {static_cast<float*>(params) + i * n, n}});
  }
  cudaStream_t compute = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking) == cudaSuccess);
  ddp::ReducerOptions options;
  options.compute_stream = compute;
  options.first_bucket_mb = 4;
  options.bucket_cap_mb = 4;
  ddp::Reducer reducer(ctx, parameters, options);
  REQUIRE(reducer.buckets().size() == 4);
  // "Backward": a long queue of device copies on the compute stream, then the gradients.
  void* scratch = nullptr;
  const std::size_t scratch_bytes = 256u << 20;
  REQUIRE(cudaMalloc(&scratch, 2 * scratch_bytes) == cudaSuccess);
  cudaEvent_t backward_done = nullptr;
  REQUIRE(cudaEventCreate(&backward_done) == cudaSuccess);
  for (int k = 0; k < 200; ++k) {
    cudaMemcpyAsync(static_cast<char*>(scratch) + scratch_bytes, scratch, scratch_bytes,
                    cudaMemcpyDeviceToDevice, compute);
  }
  for (std::size_t i = 4; i-- > 0;) {
    auto g = reducer.grad(i);
    cudaMemsetAsync(g.data(), 0, g.size() * sizeof(float), compute);
    reducer.mark_ready(i);  // queues the bucket's all-reduce after the work above
  }
  cudaEventRecord(backward_done, compute);
  // Every bucket is queued and the host never waited: backward is still running.
  CHECK(cudaEventQuery(backward_done) == cudaErrorNotReady);
  reducer.finalize();  // orders compute after the last bucket, no host sync
  REQUIRE(cudaStreamSynchronize(compute) == cudaSuccess);
  std::vector<float> g(n);
  REQUIRE(cudaMemcpy(g.data(), reducer.grad(0).data(), n * sizeof(float), cudaMemcpyDeviceToHost) ==
          cudaSuccess);
  REQUIRE(g[n - 1] == 0.0f);
  cudaFree(scratch);
  cudaFree(params);
  cudaEventDestroy(backward_done);
  cudaStreamDestroy(compute);
}

TEST_CASE("nccl: host buffers are staged for broadcast, allgather and reduce_scatter") {
  DDP_SKIP_WITHOUT_GPU();
  ddp::Context ctx = ddp::test::nccl_world_of_one();  // world size 1: the output equals the input
  std::vector<float> b(3000, 4.0f);
  ctx.broadcast(std::span<float>(b), 0);
  REQUIRE(b[2999] == 4.0f);
  std::vector<std::int32_t> in(1000, 7), out(1000, 0);
  ctx.allgather(std::span<std::int32_t>(in), std::span<std::int32_t>(out));
  REQUIRE(out == in);
  std::vector<double> rs_in(500, 1.5), rs_out(500, 0.0);
  ctx.reduce_scatter(std::span<double>(rs_in), std::span<double>(rs_out), ddp::ReduceOp::Sum);
  REQUIRE(rs_out == rs_in);
  // A device input with a host output.
  void* device = nullptr;
  REQUIRE(cudaMalloc(&device, in.size() * sizeof(std::int32_t)) == cudaSuccess);
  REQUIRE(cudaMemcpy(device, in.data(), in.size() * sizeof(std::int32_t), cudaMemcpyHostToDevice) ==
          cudaSuccess);
  std::fill(out.begin(), out.end(), 0);
  ctx.allgather(std::span<std::int32_t>(static_cast<std::int32_t*>(device), in.size()),
                std::span<std::int32_t>(out));
  REQUIRE(out == in);
  cudaFree(device);
}
