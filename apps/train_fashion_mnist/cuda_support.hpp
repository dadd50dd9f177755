#pragma once
// Small helpers of the CUDA trainer: checked CUDA and cuBLAS calls (the error names the
// call), device buffers that free themselves, and a host wait on a stream with a timeout.

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstddef>
#include <stdexcept>
#include <string>

namespace fmnist::cuda {

// A CUDA or cuBLAS call failed; what() names the call and CUDA's reason. Out of memory says
// how much was asked for and what to do.
class CudaError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Throws CudaError "<what>: <CUDA's message>" unless status is cudaSuccess.
void check(cudaError_t status, const std::string& what);
void check(cublasStatus_t status, const std::string& what);

// n elements of T in device memory (zeroed), freed with the object. Move-only.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t n, const std::string& what) : size_(n) {
    void* p = nullptr;
    const std::size_t bytes = (n == 0 ? 1 : n) * sizeof(T);
    const cudaError_t status = cudaMalloc(&p, bytes);
    if (status == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      throw CudaError("out of GPU memory allocating " + std::to_string(bytes) + " bytes for " +
                      what +
                      ": use a smaller --batch_size, or free the GPU (nvidia-smi shows what "
                      "holds it)");
    }
    check(status, "cudaMalloc of " + std::to_string(bytes) + " bytes for " + what);
    data_ = static_cast<T*>(p);
    check(cudaMemset(data_, 0, bytes), "cudaMemset of " + what);
    // cudaMemset runs on the legacy default stream, which our non-blocking streams do not
    // wait for: finish it here (allocations happen at start-up, never inside a step).
    check(cudaStreamSynchronize(nullptr), "cudaMemset of " + what);
  }
  ~DeviceBuffer() {
    if (data_ != nullptr) cudaFree(data_);
  }
  DeviceBuffer(DeviceBuffer&& other) noexcept : data_(other.data_), size_(other.size_) {
    other.data_ = nullptr;
    other.size_ = 0;
  }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      if (data_ != nullptr) cudaFree(data_);
      data_ = other.data_;
      size_ = other.size_;
      other.data_ = nullptr;
      other.size_ = 0;
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* data() const { return data_; }
  std::size_t size() const { return size_; }

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

// n elements of T in pinned (page-locked) host memory, freed with the object. Copies from the
// device into pageable memory block the host until the stream reaches them, with no
// timeout; into pinned memory they are asynchronous, and wait_stream bounds the wait.
template <typename T>
class PinnedBuffer {
 public:
  explicit PinnedBuffer(std::size_t n, const std::string& what) : size_(n) {
    void* p = nullptr;
    check(cudaMallocHost(&p, (n == 0 ? 1 : n) * sizeof(T)), "cudaMallocHost for " + what);
    data_ = static_cast<T*>(p);
  }
  ~PinnedBuffer() { cudaFreeHost(data_); }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  T* data() const { return data_; }
  std::size_t size() const { return size_; }
  T& operator[](std::size_t i) const { return data_[i]; }

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

// A non-blocking CUDA stream (it does not wait for the legacy default stream), destroyed with
// the object.
class Stream {
 public:
  Stream() {
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  ~Stream() { cudaStreamDestroy(stream_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// Blocks the host until the work queued on `stream` so far has finished, or throws CudaError
// naming `what` after `timeout` (a collective whose peer is gone never finishes; CUDA's own
// synchronize has no timeout). Polls an event: a yield, then sleeps growing to 1 ms.
void wait_stream(cudaStream_t stream, std::chrono::milliseconds timeout, const std::string& what);

// The CUDA devices this process sees (0 when none or no driver: then `why` says why).
int device_count(std::string& why);

}  // namespace fmnist::cuda
