#pragma once
// For GPU tests (built only with CUDA): why they cannot run here, the skip that says so, and
// device memory that frees itself. In a test case: `DDP_SKIP_WITHOUT_GPU();` first.

#include <cuda_runtime.h>

#include <catch2/catch.hpp>
#include <span>
#include <string>
#include <vector>

#include "skip.hpp"

namespace ddp::test {

// Why GPU tests cannot run here, or "" when a CUDA device is visible.
inline std::string no_cuda_device() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    return std::string("no CUDA device (") + cudaGetErrorString(status) + ")";
  }
  return count == 0 ? "no CUDA device" : "";
}

// Device memory holding a copy of `values`, freed with the object.
template <typename T>
struct DeviceArray {
  T* data = nullptr;
  std::size_t size = 0;
  explicit DeviceArray(const std::vector<T>& values) : size(values.size()) {
    REQUIRE(cudaMalloc(&data, values.size() * sizeof(T) + 1) == cudaSuccess);
    REQUIRE(cudaMemcpy(data, values.data(), values.size() * sizeof(T), cudaMemcpyHostToDevice) ==
            cudaSuccess);
  }
  ~DeviceArray() { cudaFree(data); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  std::span<T> span() { return {data, size}; }
};

// A copy of `count` elements of device memory at `device`.
template <typename T>
std::vector<T> to_host(const T* device, std::size_t count) {
  std::vector<T> host(count);
  REQUIRE(cudaMemcpy(host.data(), device, count * sizeof(T), cudaMemcpyDeviceToHost) ==
          cudaSuccess);
  return host;
}

template <typename T>
std::vector<T> to_host(std::span<T> device) {
  return to_host<T>(device.data(), device.size());
}

}  // namespace ddp::test

// Skips the test case (visibly, with the reason) where no CUDA device is visible.
#define DDP_SKIP_WITHOUT_GPU()                                   \
  do {                                                           \
    const std::string ddp_no_gpu = ddp::test::no_cuda_device();  \
    if (!ddp_no_gpu.empty()) return ddp::test::skip(ddp_no_gpu); \
  } while (false)
