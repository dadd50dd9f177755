#include "nccl_work.hpp"

#include <algorithm>
#include <thread>

#include "ddp/types.hpp"

namespace ddp::detail {

NcclWork::NcclWork(std::string description, CudaEventPool::Event done,
                   std::chrono::milliseconds timeout, std::shared_ptr<NcclCommState> state)
    : description_(std::move(description)),
      done_(std::move(done)),
      state_(std::move(state)),
      deadline_(NcclClock::now() + timeout),
      bound_(timeout),
      bound_source_("the collective timeout (InitOptions::timeout)") {}

void NcclWork::record_as(std::shared_ptr<CollectiveRecorder> recorder, std::uint64_t seq) {
  recorder_ = std::move(recorder);
  seq_ = seq;
}

bool NcclWork::finish(std::exception_ptr error) {
  {
    std::lock_guard lock(mutex_);
    if (finished_) return false;
    if (recorder_) recorder_->on_finished(seq_, error != nullptr);  // lock-free stores
    finished_ = true;
    error_ = std::move(error);
  }
  finished_cv_.notify_all();
  return true;
}

bool NcclWork::poll() {
  {
    std::lock_guard lock(mutex_);
    if (finished_) return true;
  }
  const cudaError_t status = cudaEventQuery(done_.get());
  // Not ready; or the process is exiting with the communicator still alive (CUDA is being
  // unloaded): nothing to report, and aborting NCCL now could only crash the exit.
  if (status == cudaErrorNotReady || status == cudaErrorCudartUnloading) return false;
  if (status != cudaSuccess) {
    (void)cudaGetLastError();  // clear a non-sticky error so that it is not reported twice
    // The stream failed: what it computes cannot be trusted, nor anything queued after.
    state_->abort(description_ +
                  ": CUDA error on the communication stream: " + cudaGetErrorString(status));
    finish(state_->aborted_error(description_));  // no-op when the abort failed it already
    return true;
  }
  // The event completed. Checked after the query: when no abort had begun by now, none had
  // begun when the event completed, so the collective really finished.
  finish(state_->aborting() ? state_->aborted_error(description_) : nullptr);
  return true;
}

bool NcclWork::wait_for(std::chrono::milliseconds timeout) {
  using std::chrono::microseconds;
  const auto deadline = NcclClock::now() + timeout;
  microseconds pause{0};
  for (;;) {
    if (poll()) {
      std::lock_guard lock(mutex_);
      if (error_) std::rethrow_exception(error_);
      return true;
    }
    if (NcclClock::now() >= deadline) break;
    std::unique_lock lock(mutex_);
    if (pause.count() == 0) {
      lock.unlock();
      std::this_thread::yield();
    } else {
      finished_cv_.wait_for(lock, std::min<NcclClock::duration>(pause, deadline - NcclClock::now()),
                            [this] { return finished_; });
    }
    pause = std::min(pause * 2 + microseconds(10), microseconds(1000));
  }
  state_->abort(description_ + " did not finish within the " + std::to_string(timeout.count()) +
                " ms its wait allowed (Work::wait); the NCCL communicator was aborted (a rank "
                "stopped or is stuck before this collective)");
  return false;
}

bool NcclWork::done() { return poll(); }

void NcclWork::wait_on_stream(void* stream, std::chrono::milliseconds timeout) {
  {
    std::lock_guard lock(mutex_);
    if (finished_ && error_) std::rethrow_exception(error_);
    const auto bound = NcclClock::now() + timeout;
    if (!finished_ && bound < deadline_) {
      deadline_ = bound;
      bound_ = timeout;
      bound_source_ = "the timeout of Work::wait_on_stream";
    }
  }
  const cudaError_t status = cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), done_.get(), 0);
  if (status != cudaSuccess) {
    throw CommError("ordering a stream after " + description_ +
                    ": CUDA error: " + cudaGetErrorString(status));
  }
}

NcclClock::time_point NcclWork::deadline() const {
  std::lock_guard lock(mutex_);
  return deadline_;
}

std::string NcclWork::timeout_reason() const {
  std::lock_guard lock(mutex_);
  return description_ + " did not finish within " + std::to_string(bound_.count()) + " ms, " +
         bound_source_ +
         "; the NCCL watchdog aborted the communicator (a rank stopped, or is stuck, before "
         "this collective)";
}

}  // namespace ddp::detail
