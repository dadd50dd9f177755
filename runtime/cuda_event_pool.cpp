#include "cuda_event_pool.hpp"

#include "ddp/types.hpp"

namespace ddp::detail {

CudaEventPool::Event& CudaEventPool::Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    reset();
    pool_ = std::move(other.pool_);
    event_ = other.event_;
    other.event_ = nullptr;
  }
  return *this;
}

void CudaEventPool::Event::reset() noexcept {
  if (event_ != nullptr && pool_) pool_->give_back(event_);
  event_ = nullptr;
  pool_.reset();
}

CudaEventPool::~CudaEventPool() {
  for (cudaEvent_t event : free_) cudaEventDestroy(event);
}

CudaEventPool::Event CudaEventPool::acquire(const std::string& what) {
  {
    std::lock_guard lock(mutex_);
    if (!free_.empty()) {
      cudaEvent_t event = free_.back();
      free_.pop_back();
      return Event(shared_from_this(), event);
    }
  }
  cudaEvent_t event = nullptr;
  const cudaError_t status = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
  if (status != cudaSuccess) {
    throw CommError(what + ": creating a CUDA event: CUDA error: " + cudaGetErrorString(status));
  }
  return Event(shared_from_this(), event);
}

void CudaEventPool::give_back(cudaEvent_t event) noexcept {
  try {
    std::lock_guard lock(mutex_);
    free_.push_back(event);
  } catch (...) {
    cudaEventDestroy(event);  // no memory for the list: just destroy it
  }
}

}  // namespace ddp::detail
