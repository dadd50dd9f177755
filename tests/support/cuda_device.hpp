#pragma once
// For GPU tests (built only with CUDA): why they cannot run here, or "" when a CUDA device is
// visible. Use with ddp::test::skip(): `if (auto why = no_cuda_device(); !why.empty())
// return ddp::test::skip(why);`.

#include <cuda_runtime.h>

#include <string>

namespace ddp::test {

inline std::string no_cuda_device() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    return std::string("no CUDA device (") + cudaGetErrorString(status) + ")";
  }
  return count == 0 ? "no CUDA device" : "";
}

}  // namespace ddp::test
