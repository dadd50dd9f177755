#include "cuda_support.hpp"

#include <algorithm>
#include <thread>

namespace fmnist::cuda {

void check(cudaError_t status, const std::string& what) {
  if (status == cudaSuccess) return;
  std::string message = what + ": CUDA error: " + cudaGetErrorString(status);
  if (status == cudaErrorMemoryAllocation) {
    message += " (out of GPU memory: use a smaller --batch_size, or free the GPU)";
  }
  throw CudaError(message);
}

void check(cublasStatus_t status, const std::string& what) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  throw CudaError(what + ": cuBLAS error: " + cublasGetStatusString(status));
}

void wait_stream(cudaStream_t stream, std::chrono::milliseconds timeout, const std::string& what) {
  using std::chrono::microseconds;
  cudaEvent_t done = nullptr;
  check(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate for " + what);
  struct Release {
    cudaEvent_t event;
    ~Release() { cudaEventDestroy(event); }
  } release{done};
  check(cudaEventRecord(done, stream), "cudaEventRecord for " + what);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  microseconds pause{0};
  for (;;) {
    const cudaError_t status = cudaEventQuery(done);
    if (status == cudaSuccess) return;
    if (status != cudaErrorNotReady) check(status, what);
    if (std::chrono::steady_clock::now() >= deadline) {
      throw CudaError(what + ": the GPU did not finish within " + std::to_string(timeout.count()) +
                      " ms (a collective waiting for a rank that stopped? --timeout sets this)");
    }
    if (pause.count() == 0) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(pause);
    }
    pause = std::min(pause * 2 + microseconds(10), microseconds(1000));
  }
}

int device_count(std::string& why) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    why = std::string("no usable CUDA device: ") + cudaGetErrorString(status);
    return 0;
  }
  if (count == 0) why = "no CUDA device";
  return count;
}

}  // namespace fmnist::cuda
