#pragma once
// The Work of a NCCL collective: a pooled CUDA event recorded after it on the communication
// stream, and a completion that only NcclWork::finish sets (success, or the error of an
// abort / a CUDA failure). Internal to libddp; built only with CUDA + NCCL.
//
// A collective counts as finished successfully only when its event completed before any
// abort began: after ncclCommAbort the kernels exit and the event completes on buffers
// holding garbage, so every Work not seen finished by then fails with the abort's reason.

#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <string>

#include "collective_recorder.hpp"
#include "cuda_event_pool.hpp"
#include "ddp/work.hpp"
#include "nccl_comm_state.hpp"

namespace ddp::detail {

class NcclWork : public WorkState {
 public:
  // `description` names the collective ("allreduce(sum, f32 x 1000) #17 (rank 0, nccl)");
  // `done` is recorded on the stream after it; `timeout` is the communicator's collective
  // timeout, counted from now.
  NcclWork(std::string description, CudaEventPool::Event done, std::chrono::milliseconds timeout,
           std::shared_ptr<NcclCommState> state);

  // Polls the event (yield, then sleeps growing to 1 ms; an abort wakes it at once): CUDA
  // has no wait on an event with a timeout (cudaEventSynchronize has none). Past
  // `timeout` it aborts the communicator, naming this collective and the timeout, and
  // returns false. Rethrows the failure of an aborted or failed collective.
  bool wait_for(std::chrono::milliseconds timeout) override;
  bool done() override;
  // Orders `stream` after the collective without a host wait, and bounds it: when the
  // collective has not finished within `timeout` from now, the watchdog aborts the
  // communicator (the stream then moves on and the next call or wait reports the abort).
  // Throws at once when the collective already failed.
  void wait_on_stream(void* stream, std::chrono::milliseconds timeout) override;
  std::string describe() const override { return description_; }

  // For the watchdog and waiters: looks at the event once, completing the Work when it has
  // finished; true when the Work is complete (successfully or not). Never blocks.
  bool poll();
  // Completes the Work with `error` unless it is complete already (the first completion
  // wins). The only place a NcclWork completes. Returns whether this call completed it.
  bool finish(std::exception_ptr error);
  // Makes finish() record this collective as collective `seq` (finished, or failed) before
  // any waiter wakes. Call before the Work is watched.
  void record_as(std::shared_ptr<CollectiveRecorder> recorder, std::uint64_t seq);
  // When the watchdog aborts if the Work is still pending, and the message it aborts with.
  NcclClock::time_point deadline() const;
  std::string timeout_reason() const;

 private:
  const std::string description_;
  CudaEventPool::Event done_;
  const std::shared_ptr<NcclCommState> state_;
  mutable std::mutex mutex_;
  std::condition_variable finished_cv_;
  bool finished_ = false;                         // guarded by mutex_
  std::exception_ptr error_;                      // guarded by mutex_
  NcclClock::time_point deadline_;                // guarded by mutex_
  std::chrono::milliseconds bound_;               // guarded by mutex_: the timeout behind deadline_
  std::string bound_source_;                      // guarded by mutex_: which setting it is
  std::shared_ptr<CollectiveRecorder> recorder_;  // set before watched; null: not recording
  std::uint64_t seq_ = 0;
};

}  // namespace ddp::detail
