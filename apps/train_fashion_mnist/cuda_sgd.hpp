#pragma once
// Sgd (sgd.hpp) on the GPU: the same update, one kernel per parameter on the compute stream,
// momentum buffers in device memory.

#include <cuda_runtime.h>

#include <chrono>
#include <cstddef>
#include <span>
#include <vector>

#include "cuda_support.hpp"

namespace fmnist {

class CudaSgd {
 public:
  // One zeroed device momentum buffer per parameter, of these sizes.
  CudaSgd(double lr, double momentum, const std::vector<std::size_t>& sizes, cudaStream_t stream);

  // params[i] -= lr * updated buffer i (device spans, as in Sgd::step), queued on the stream.
  void step(const std::vector<std::span<float>>& params,
            const std::vector<std::span<float>>& grads);

  // Copies the momentum buffers to / from host vectors of the same sizes (checkpoints);
  // download waits for the copies (up to `timeout`).
  void download(std::vector<std::vector<float>>& host, std::chrono::milliseconds timeout);
  void upload(const std::vector<std::vector<float>>& host);

 private:
  float lr_;
  float momentum_;
  cudaStream_t stream_;
  std::vector<cuda::DeviceBuffer<float>> buffers_;
};

}  // namespace fmnist
