#pragma once
// The quickstart network on a GPU: the same layers, parameter order and arithmetic as Mlp
// (mlp.hpp), with the matrix products in cuBLAS (plain FP32, no TF32, so it follows the CPU
// path closely) and the rest in our kernels (cuda_kernels.hpp). Everything is queued on one
// stream, the compute stream; nothing here waits on the host.
//
// Layout: row-major as in Mlp (a weight is out x in). cuBLAS is column-major, so each
// product is issued on the transposed views: a row-major R x C matrix is a column-major
// C x R one with leading dimension C.

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "cuda_support.hpp"
#include "mlp.hpp"

namespace fmnist {

class CudaMlp {
 public:
  // Copies `host` (an Mlp's parameters, registration order) to the device. Forward and
  // backward accept up to max_batch images. Kernels run on `stream`.
  CudaMlp(const std::vector<ParameterView>& host, int max_batch, cudaStream_t stream);
  ~CudaMlp();
  CudaMlp(const CudaMlp&) = delete;
  CudaMlp& operator=(const CudaMlp&) = delete;

  // Device views of the parameters, registration order (fc1.weight, fc1.bias, ...).
  std::vector<ParameterView> parameters();

  // Where backward writes gradient i (device memory, the size of parameter i).
  void set_gradients(std::vector<std::span<float>> gradients);

  // Forward over `batch` device images (batch x 784); returns the device logits
  // (batch x 10), valid until the next call.
  const float* forward(const float* images, int batch);

  // Writes the mean cross-entropy of the last forward against device `labels` into *loss
  // (device memory), then backward: writes every gradient (overwriting) and calls ready(i)
  // once gradient i's kernels are queued, in the order fc3.bias, fc3.weight, ..., fc1.weight.
  void backward(const std::int32_t* labels, double* loss,
                const std::function<void(std::size_t)>& ready);

  // Copies the device parameters into `host` (same order and sizes) / from it, ordered on
  // the stream; download waits for the copies (up to `timeout`).
  void download(const std::vector<ParameterView>& host, std::chrono::milliseconds timeout);
  void upload(const std::vector<ParameterView>& host);

 private:
  struct Layer {
    int in = 0;
    int out = 0;
    cuda::DeviceBuffer<float> weight;  // out x in
    cuda::DeviceBuffer<float> bias;    // out
  };
  // y = x * weight^T + bias (then ReLU), for `batch` rows.
  void linear_forward(const Layer& l, const float* x, int batch, float* y, bool relu);
  // gradient of weight = grad_out^T * x; of bias = column sums of grad_out.
  void linear_backward(int layer, const float* x, const float* grad_out);

  cudaStream_t stream_;
  cublasHandle_t blas_ = nullptr;
  int max_batch_;
  Layer layers_[3];
  std::vector<std::span<float>> gradients_;
  const float* input_ = nullptr;  // the last forward's images (device)
  int batch_ = 0;
  cuda::DeviceBuffer<float> hidden_[2];  // post-ReLU activations (max_batch x 512)
  cuda::DeviceBuffer<float> logits_;     // max_batch x 10
  cuda::DeviceBuffer<float> grad_out_;   // d loss / d (layer output), max_batch x 512
  cuda::DeviceBuffer<float> grad_in_;    // d loss / d (layer input), max_batch x 512
};

}  // namespace fmnist
