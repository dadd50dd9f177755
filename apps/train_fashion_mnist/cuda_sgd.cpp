#include "cuda_sgd.hpp"

#include <stdexcept>
#include <string>

#include "cuda_kernels.hpp"

namespace fmnist {

CudaSgd::CudaSgd(double lr, double momentum, const std::vector<std::size_t>& sizes,
                 cudaStream_t stream)
    : lr_(static_cast<float>(lr)), momentum_(static_cast<float>(momentum)), stream_(stream) {
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    buffers_.emplace_back(sizes[i], "momentum buffer " + std::to_string(i));
  }
}

void CudaSgd::step(const std::vector<std::span<float>>& params,
                   const std::vector<std::span<float>>& grads) {
  if (params.size() != buffers_.size() || grads.size() != buffers_.size()) {
    throw std::invalid_argument("CudaSgd::step: one parameter and one gradient per buffer");
  }
  for (std::size_t i = 0; i < buffers_.size(); ++i) {
    cuda::check(cuda::sgd_momentum(params[i].data(), grads[i].data(), buffers_[i].data(),
                                   buffers_[i].size(), lr_, momentum_, stream_),
                "sgd_momentum kernel");
  }
}

void CudaSgd::download(std::vector<std::vector<float>>& host, std::chrono::milliseconds timeout) {
  host.resize(buffers_.size());
  for (std::size_t i = 0; i < buffers_.size(); ++i) {
    host[i].resize(buffers_[i].size());
    cuda::check(
        cudaMemcpyAsync(host[i].data(), buffers_[i].data(), buffers_[i].size() * sizeof(float),
                        cudaMemcpyDeviceToHost, stream_),
        "copying momentum buffer " + std::to_string(i) + " to the host");
  }
  cuda::wait_stream(stream_, timeout, "copying the momentum buffers to the host");
}

void CudaSgd::upload(const std::vector<std::vector<float>>& host) {
  if (host.size() != buffers_.size()) throw std::invalid_argument("CudaSgd: buffer count differs");
  for (std::size_t i = 0; i < buffers_.size(); ++i) {
    if (host[i].size() != buffers_[i].size()) {
      throw std::invalid_argument("CudaSgd: momentum buffer " + std::to_string(i) +
                                  " has the wrong size");
    }
    cuda::check(cudaMemcpyAsync(buffers_[i].data(), host[i].data(), host[i].size() * sizeof(float),
                                cudaMemcpyHostToDevice, stream_),
                "copying momentum buffer " + std::to_string(i) + " to the device");
  }
}

}  // namespace fmnist
