// The NCCL backend's failure paths at world size 1 (one GPU): Context::abort while a
// collective is queued, and the watchdog ending a collective that cannot finish. A world of
// two with one rank absent cannot make the communicator (NCCL's init needs every rank), so a
// collective that cannot finish is made here the honest way one GPU allows: it is ordered
// after a stream that a host function holds closed. Built with CUDA; skips without a device.
#include <cuda_runtime.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "cuda_device.hpp"
#include "ddp/common/collective_record.hpp"
#include "ddp/runtime.hpp"
#include "ddp/store/memory_store.hpp"
#include "skip.hpp"
#include "thread_world.hpp"

using Catch::Matchers::Contains;

namespace {

constexpr const char* kReason = "operator stop: rank declared hung";
constexpr std::size_t kCount = 1024;

ddp::Context nccl_context(std::chrono::milliseconds timeout) {
  ddp::InitOptions options;
  options.backend = ddp::Backend::Nccl;
  options.init_timeout = std::chrono::seconds(60);
  options.timeout = timeout;
  return ddp::init(ddp::test::thread_env(0, 1), std::make_shared<ddp::store::MemoryStore>(),
                   options);
}

// A stream on which everything queued waits until release(): a host function at its head
// blocks CUDA's callback thread (for 60 s at most, so that a failing test cannot hang).
class StreamGate {
 public:
  StreamGate() {
    REQUIRE(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking) == cudaSuccess);
    REQUIRE(cudaLaunchHostFunc(stream_, &StreamGate::hold, this) == cudaSuccess);
  }
  ~StreamGate() {
    release();
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
  StreamGate(const StreamGate&) = delete;
  StreamGate& operator=(const StreamGate&) = delete;

  cudaStream_t stream() const { return stream_; }
  void release() {
    {
      std::lock_guard lock(mutex_);
      open_ = true;
    }
    opened_.notify_all();
  }

 private:
  static void CUDART_CB hold(void* self) {
    auto* gate = static_cast<StreamGate*>(self);
    std::unique_lock lock(gate->mutex_);
    gate->opened_.wait_for(lock, std::chrono::seconds(60), [gate] { return gate->open_; });
  }

  cudaStream_t stream_ = nullptr;
  std::mutex mutex_;
  std::condition_variable opened_;
  bool open_ = false;
};

// kCount floats of device memory, freed with the object.
class DeviceFloats {
 public:
  DeviceFloats() { REQUIRE(cudaMalloc(&data_, kCount * sizeof(float)) == cudaSuccess); }
  ~DeviceFloats() { cudaFree(data_); }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;
  float* data() const { return static_cast<float*>(data_); }
  std::span<float> span() const { return {data(), kCount}; }

 private:
  void* data_ = nullptr;
};

ddp::Work queue_allreduce(ddp::Context& ctx, const DeviceFloats& buffer, cudaStream_t after) {
  ddp::CollectiveOptions options;
  options.after_stream = after;
  return ctx.communicator().allreduce(buffer.data(), kCount, ddp::DType::F32, ddp::ReduceOp::Sum,
                                      options);
}

}  // namespace

#define SKIP_WITHOUT_GPU()                                  \
  do {                                                      \
    const std::string reason = ddp::test::no_cuda_device(); \
    if (!reason.empty()) {                                  \
      return ddp::test::skip(reason);                       \
    }                                                       \
  } while (false)

TEST_CASE("nccl: abort during a queued collective fails every pending and later wait") {
  SKIP_WITHOUT_GPU();
  ddp::Context ctx = nccl_context(std::chrono::seconds(60));
  DeviceFloats buffer;
  StreamGate gate;
  ddp::Work first = queue_allreduce(ctx, buffer, gate.stream());
  ddp::Work second = queue_allreduce(ctx, buffer, gate.stream());
  REQUIRE_FALSE(first.completed());
  // From another thread, as a program's hang handling would: ncclCommAbort may wait for the
  // gated stream, the waits below must not.
  auto aborter = std::async(std::launch::async, [&] { ctx.abort(kReason); });
  const auto start = std::chrono::steady_clock::now();
  REQUIRE_THROWS_WITH(first.wait(std::chrono::seconds(30)), Contains(kReason));
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(20));
  cudaStream_t other = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE_THROWS_WITH(second.wait_on_stream(other), Contains(kReason));
  REQUIRE_THROWS_WITH(ctx.allreduce(buffer.span()), Contains(kReason));
  REQUIRE_THROWS_WITH(ctx.barrier(), Contains(kReason));
  gate.release();
  REQUIRE(aborter.wait_for(std::chrono::seconds(60)) == std::future_status::ready);
  aborter.get();
  // The kernels exited and the events completed: still an error, never a success.
  REQUIRE_THROWS_WITH(first.wait(std::chrono::seconds(5)), Contains(kReason));
  REQUIRE_THROWS_WITH(second.wait(std::chrono::seconds(5)), Contains(kReason));
  REQUIRE(cudaStreamSynchronize(other) == cudaSuccess);
  cudaStreamDestroy(other);
}

TEST_CASE("nccl: a collective that cannot finish ends at the collective timeout, named") {
  SKIP_WITHOUT_GPU();
  ddp::Context ctx = nccl_context(std::chrono::seconds(2));
  DeviceFloats buffer;
  StreamGate gate;
  const auto start = std::chrono::steady_clock::now();
  ddp::Work stuck = queue_allreduce(ctx, buffer, gate.stream());
  // The wait allows far longer than the timeout: the watchdog ends it at 2 s.
  std::string error;
  try {
    stuck.wait(std::chrono::seconds(50));
  } catch (const ddp::CommError& e) {
    error = e.what();
  }
  const auto elapsed = std::chrono::steady_clock::now() - start;
  INFO(error);
  CHECK(elapsed >= std::chrono::milliseconds(1900));
  CHECK(elapsed < std::chrono::seconds(40));
  CHECK_THAT(error, Contains("allreduce(sum, f32 x 1024) #1"));
  CHECK_THAT(error, Contains("2000 ms"));
  CHECK_THAT(error, Contains("watchdog"));
  REQUIRE_THROWS_WITH(ctx.barrier(), Contains("#1"));
  gate.release();
}

TEST_CASE("nccl: the timeout of wait_on_stream is honoured by the watchdog") {
  SKIP_WITHOUT_GPU();
  ddp::Context ctx = nccl_context(std::chrono::seconds(120));
  DeviceFloats buffer;
  StreamGate gate;
  cudaStream_t compute = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking) == cudaSuccess);
  ddp::Work stuck = queue_allreduce(ctx, buffer, gate.stream());
  const auto start = std::chrono::steady_clock::now();
  stuck.wait_on_stream(compute, std::chrono::seconds(1));  // no host wait
  std::string error;
  try {
    stuck.wait(std::chrono::seconds(60));
  } catch (const ddp::CommError& e) {
    error = e.what();
  }
  INFO(error);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(40));
  CHECK_THAT(error, Contains("1000 ms"));
  CHECK_THAT(error, Contains("wait_on_stream"));
  gate.release();
  // The compute stream is not held forever: the aborted collective's event completes.
  REQUIRE(cudaStreamSynchronize(compute) == cudaSuccess);
  cudaStreamDestroy(compute);
}

TEST_CASE("nccl: after normal use the watchdog reports success, and a Work outlives it") {
  SKIP_WITHOUT_GPU();
  ddp::Work kept;
  {
    ddp::Context ctx = nccl_context(std::chrono::seconds(60));
    DeviceFloats buffer;
    for (int i = 0; i < 100; ++i) {
      kept = queue_allreduce(ctx, buffer, nullptr);
      kept.wait(std::chrono::seconds(30));  // fails on a false abort or a lost completion
    }
    ctx.barrier();
  }
  CHECK(kept.completed());
  kept.wait(std::chrono::seconds(1));
}

TEST_CASE("nccl: the agent's stop request in the record page aborts with ddprun's reason") {
  SKIP_WITHOUT_GPU();
  // The record page as ddprun makes it, and writes into when the job hung.
  const int fd = memfd_create("ddp-stop-request-test", MFD_CLOEXEC);
  REQUIRE(fd >= 0);
  REQUIRE(ftruncate(fd, sizeof(ddp::record::RecordPage)) == 0);
  void* mapped =
      mmap(nullptr, sizeof(ddp::record::RecordPage), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  REQUIRE(mapped != MAP_FAILED);
  auto* page = static_cast<ddp::record::RecordPage*>(mapped);
  ddp::InitOptions options;
  options.backend = ddp::Backend::Nccl;
  options.init_timeout = std::chrono::seconds(60);
  options.timeout = std::chrono::seconds(60);
  options.record_fd = fd;
  {
    ddp::Context ctx = ddp::init(ddp::test::thread_env(0, 1),
                                 std::make_shared<ddp::store::MemoryStore>(), options);
    REQUIRE(page->magic.load() == ddp::record::kRecordMagic);
    DeviceFloats buffer;
    StreamGate gate;
    ddp::Work stuck = queue_allreduce(ctx, buffer, gate.stream());
    page->stop_requested.store(1);
    const auto start = std::chrono::steady_clock::now();
    REQUIRE_THROWS_WITH(stuck.wait(std::chrono::seconds(30)),
                        Contains("ddprun found the job hung"));
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(20));
    REQUIRE_THROWS_WITH(ctx.barrier(), Contains("ddprun found the job hung"));
    gate.release();
  }
  munmap(mapped, sizeof(ddp::record::RecordPage));
  close(fd);
}

// Issue 24: the compute stream was ordered after a collective (wait_on_stream) and goes on
// without the host. When an abort cuts that collective short, its buffer holds garbage; the
// guard queued behind the wait turns it into NaN before later work on the stream reads it.
TEST_CASE("nccl: after an abort, work the compute stream queued after the wait sees NaN") {
  SKIP_WITHOUT_GPU();
  ddp::Context ctx = nccl_context(std::chrono::seconds(60));
  ddp::Communicator& comm = ctx.communicator();
  REQUIRE(comm.abort_flag_on_device() != nullptr);
  DeviceFloats buffer;
  REQUIRE(cudaMemset(buffer.data(), 0, kCount * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  cudaStream_t compute = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking) == cudaSuccess);
  float* seen = nullptr;  // pinned: a copy into pageable memory would block this thread
  REQUIRE(cudaMallocHost(reinterpret_cast<void**>(&seen), kCount * sizeof(float)) == cudaSuccess);
  std::fill(seen, seen + kCount, 1.0f);
  {
    StreamGate gate;
    ddp::Work held = queue_allreduce(ctx, buffer, gate.stream());
    held.wait_on_stream(compute, std::chrono::seconds(60));
    const bool guarded = comm.poison_if_aborted(buffer.data(), kCount, compute);
    if (!guarded) {
      gate.release();
      cudaStreamDestroy(compute);
      cudaFreeHost(seen);
      return ddp::test::skip("libddp was built without nvcc: no abort guard kernel");
    }
    // "The optimizer step": a copy out, queued after the guard.
    REQUIRE(cudaMemcpyAsync(seen, buffer.data(), kCount * sizeof(float), cudaMemcpyDeviceToHost,
                            compute) == cudaSuccess);
    CHECK_FALSE(comm.aborted());
    auto aborter = std::async(std::launch::async, [&] { ctx.abort(kReason); });
    const auto start = std::chrono::steady_clock::now();
    while (!comm.aborted() && std::chrono::steady_clock::now() - start < std::chrono::seconds(30)) {
      std::this_thread::yield();
    }
    CHECK(comm.aborted());
    gate.release();
    REQUIRE(aborter.wait_for(std::chrono::seconds(60)) == std::future_status::ready);
    aborter.get();
  }
  REQUIRE(cudaStreamSynchronize(compute) == cudaSuccess);
  cudaStreamDestroy(compute);
  CHECK(std::all_of(seen, seen + kCount, [](float v) { return std::isnan(v); }));
  cudaFreeHost(seen);
}

TEST_CASE("nccl: without an abort the guard leaves the results alone") {
  SKIP_WITHOUT_GPU();
  ddp::Context ctx = nccl_context(std::chrono::seconds(60));
  DeviceFloats buffer;
  std::vector<float> ones(kCount, 1.0f), seen(kCount, 0.0f);
  REQUIRE(cudaMemcpy(buffer.data(), ones.data(), kCount * sizeof(float), cudaMemcpyHostToDevice) ==
          cudaSuccess);
  cudaStream_t compute = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking) == cudaSuccess);
  ddp::Work work = queue_allreduce(ctx, buffer, nullptr);
  work.wait_on_stream(compute, std::chrono::seconds(60));
  ctx.communicator().poison_if_aborted(buffer.data(), kCount, compute);
  REQUIRE(cudaMemcpyAsync(seen.data(), buffer.data(), kCount * sizeof(float),
                          cudaMemcpyDeviceToHost, compute) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(compute) == cudaSuccess);
  cudaStreamDestroy(compute);
  CHECK(seen == ones);  // world size 1: the sum is the value
}
