#pragma once
// The GPU backend: NCCL on a dedicated CUDA stream. Collectives are ordered after an event
// recorded on the caller's stream (CollectiveOptions::after_stream) and complete through an
// event, never a host sync on the issuing path. Host buffers are accepted too: they are
// staged through device memory and such calls complete before they return. Each collective
// is watched (NcclCommState's watchdog): past its timeout, or on an asynchronous NCCL error,
// the communicator is aborted and every pending and later call fails with the reason.
// Internal to libddp; built only with CUDA + NCCL.

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "call_check.hpp"
#include "cuda_event_pool.hpp"
#include "ddp/communicator.hpp"
#include "ddp/context.hpp"
#include "nccl_comm_state.hpp"
#include "nccl_work.hpp"

namespace ddp::detail {

class NcclCommunicator : public Communicator {
 public:
  // Picks the device, waits until every rank has arrived in the store, exchanges the unique
  // id(s) and builds a non-blocking communicator, all within options.init_timeout: past it,
  // InitError naming the ranks that never arrived or never called NCCL's init (the
  // half-built communicator is aborted). `store` is a view private to this communicator.
  NcclCommunicator(std::shared_ptr<store::Store> store, const LaunchEnv& env,
                   const InitOptions& options, MismatchCheck check);
  ~NcclCommunicator() override;

  Backend backend() const override { return Backend::Nccl; }
  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  int device() const { return device_; }

  Work allreduce(void* data, std::size_t count, DType dtype, ReduceOp op,
                 const CollectiveOptions& options) override;
  Work broadcast(void* data, std::size_t count, DType dtype, int root,
                 const CollectiveOptions& options) override;
  Work allgather(const void* in, void* out, std::size_t count, DType dtype,
                 const CollectiveOptions& options) override;
  Work reduce_scatter(const void* in, void* out, std::size_t count, DType dtype, ReduceOp op,
                      const CollectiveOptions& options) override;
  Work barrier() override;
  std::shared_ptr<void> allocate(std::size_t bytes) override;
  void fill_zero(void* data, std::size_t bytes, void* stream) override;
  void set_mismatch_check(MismatchCheck check) override { policy_.set(check); }
  // Thread-safe. Every pending Work fails with `reason` at once, then ncclCommAbort ends the
  // kernels on the stream; later calls throw CommError with the reason.
  void abort(const std::string& reason) override;
  bool aborted() const override { return state_->aborting(); }
  const int* abort_flag_on_device() const override { return state_->abort_flag_on_device(); }
  // Queues the NaN guard (wire_kernels.hpp) on `stream`; false when built without nvcc.
  bool poison_if_aborted(float* data, std::size_t count, void* stream) override;
  // Also hands the page's stop request to the watchdog (NcclCommState::watch_stop_request).
  void set_recorder(std::shared_ptr<detail::CollectiveRecorder> recorder) override {
    state_->watch_stop_request(recorder.get());
    Communicator::set_recorder(std::move(recorder));
  }

 private:
  // Waits (up to timeout_) for the last queued operation; destroys the communicator, or
  // aborts it when that operation never finished (a lost peer); frees the stream. Idempotent.
  void release() noexcept;
  void wait_for_all_ranks(NcclClock::time_point deadline, std::chrono::milliseconds timeout);
  void init_communicator(const InitOptions& options, NcclClock::time_point deadline,
                         std::chrono::milliseconds timeout);
  // Waits until the unique id key(s) are in the store, up to `deadline` (InitError naming
  // them otherwise).
  void wait_for_ids(const std::vector<std::string>& keys, NcclClock::time_point deadline,
                    std::chrono::milliseconds timeout);
  // Waits until the communicator's pending init settles; aborts it and throws InitError when
  // it fails or `deadline` passes. `first` is what the init call returned.
  void finish_init(ncclResult_t first, NcclClock::time_point deadline,
                   std::chrono::milliseconds timeout);
  // The ranks whose key `prefix`<rank> is not in the store, as "1, 3 (and 2 more)"; sets
  // `absent` to their number.
  std::string ranks_without(const std::string& prefix, int& absent);
  // Checks what an NCCL call on the (non-blocking) communicator returned: ncclInProgress is
  // waited out (up to timeout_, or until an abort begins). state_->mutex must be held; on a
  // timeout the communicator is aborted. Throws CommError naming `what` on failure.
  void enqueued(ncclResult_t status, const std::string& what);
  // Makes one NCCL call, call(comm), under state_->mutex and checks it (enqueued); throws the
  // abort's error instead when an abort began. The only place the issuing thread takes the
  // mutex: CUDA calls, which can block behind a stuck kernel, are made without it.
  template <typename Call>
  void nccl_call(const std::string& what, Call&& call);
  // Cross-rank comparison through the store (NCCL has no cheap host-side collective).
  void check_call(const CallDescriptor& call);
  // Orders the communication stream after `after`, queues `enqueue`'s work on it, records a
  // pooled event after it and hands the Work (numbered: "#<sequence>") to the watchdog.
  // Records the call (with its Reducer bucket) when recording. Holds no lock across its CUDA
  // calls (an abort never waits for them); `enqueue` makes its NCCL calls through nccl_call.
  template <typename Enqueue>
  Work launch(const CallDescriptor& call, void* after, std::optional<std::size_t> bucket,
              Enqueue&& enqueue);
  template <typename Enqueue>
  Work launch(const CallDescriptor& call, void* after, Enqueue&& enqueue) {
    return launch(call, after, std::nullopt, std::forward<Enqueue>(enqueue));
  }
  // allgather / reduce_scatter: runs collective(src, dst) on device buffers, staging `in`
  // and `out` when either is host memory.
  template <typename Collective>
  Work staged(const CallDescriptor& call, void* after, const void* in, std::size_t in_bytes,
              void* out, std::size_t out_bytes, Collective&& collective);
  // allreduce of F32 device memory through a 16-bit wire type: narrowed (pre-divided by the
  // world size for Avg, as PyTorch's fp16 compression hook does, so a sum cannot overflow
  // f16) into wire_buffer(), summed in 16 bits, widened back in place; all on stream_.
  Work allreduce_compressed(void* data, std::size_t count, ReduceOp op, DType wire,
                            const CollectiveOptions& options);
  // The 16-bit wire buffer, at least `bytes`, for work queued on stream_ next. It grows with
  // stream-ordered allocation (the old one is freed after the work already queued on it).
  void* wire_buffer(std::size_t bytes);
  // A device buffer of at least `bytes` for staging host memory (grows, never shrinks).
  void* staging(std::size_t bytes, std::size_t slot);
  // Pinned host memory of at least `bytes` (grows, never shrinks): the host end of staged
  // copies. Copies to or from pageable memory would block the host until the stream drains,
  // with no timeout; from pinned memory they are asynchronous and the host waits on the
  // Work instead.
  void* pinned(std::size_t bytes, std::size_t slot);

  std::shared_ptr<store::Store> store_;
  const int rank_;
  const int world_size_;
  const std::chrono::milliseconds timeout_;  // each collective, and the drain at destruction
  int device_ = 0;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  MismatchPolicy policy_;
  std::uint64_t checks_ = 0;
  std::uint64_t sequence_ = 0;      // collectives issued, numbering them in messages
  std::shared_ptr<NcclWork> last_;  // the latest operation queued on stream_
  std::shared_ptr<NcclCommState> state_ = std::make_shared<NcclCommState>();
  std::shared_ptr<CudaEventPool> events_ = std::make_shared<CudaEventPool>();
  CudaEventPool::Event ready_;  // orders stream_ after the caller's stream (re-recorded per call)
  std::shared_ptr<void> staging_[2];
  std::size_t staging_bytes_[2] = {0, 0};
  void* wire_ = nullptr;  // see wire_buffer(); freed in release()
  std::size_t wire_bytes_ = 0;
  std::shared_ptr<void> pinned_[2];
  std::size_t pinned_bytes_[2] = {0, 0};
};

}  // namespace ddp::detail
