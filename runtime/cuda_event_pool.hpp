#pragma once
// Reusable CUDA events for the NCCL backend: one per queued collective, so creating and
// destroying an event per call (and leaking it when a call fails half-way) is replaced by a
// pool that the handle returns its event to. Internal to libddp; built only with CUDA.

#include <cuda_runtime.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace ddp::detail {

class CudaEventPool : public std::enable_shared_from_this<CudaEventPool> {
 public:
  // An event of the pool, given back when the handle goes (also on an error path). Move-only.
  // Re-recording a given-back event is safe: a stream that already waits on it waits for the
  // record it saw (CUDA's semantics of cudaStreamWaitEvent).
  class Event {
   public:
    Event() = default;
    Event(std::shared_ptr<CudaEventPool> pool, cudaEvent_t event)
        : pool_(std::move(pool)), event_(event) {}
    ~Event() { reset(); }
    Event(Event&& other) noexcept : pool_(std::move(other.pool_)), event_(other.event_) {
      other.event_ = nullptr;
    }
    Event& operator=(Event&& other) noexcept;
    Event(const Event&) = delete;
    Event& operator=(const Event&) = delete;

    cudaEvent_t get() const { return event_; }
    // Gives the event back now.
    void reset() noexcept;

   private:
    std::shared_ptr<CudaEventPool> pool_;
    cudaEvent_t event_ = nullptr;
  };

  // Make with std::make_shared (handles keep the pool alive).
  CudaEventPool() = default;
  // Destroys the free events (the handles out there keep the pool alive until they go).
  ~CudaEventPool();
  CudaEventPool(const CudaEventPool&) = delete;
  CudaEventPool& operator=(const CudaEventPool&) = delete;

  // A free event, or a new one (cudaEventDisableTiming) on the current device. Throws
  // CommError naming `what` when CUDA cannot make one. Thread-safe.
  Event acquire(const std::string& what);

 private:
  void give_back(cudaEvent_t event) noexcept;

  std::mutex mutex_;
  std::vector<cudaEvent_t> free_;
};

}  // namespace ddp::detail
