#pragma once
// The CUDA trainer's own kernels: everything but the matrix products (cuBLAS does those).
// Each function queues one kernel on `stream` and returns the launch status. Matrices are
// row-major, as in the CPU Mlp. Plain C++17 so that nvcc and the C++20 sources share it.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace fmnist::cuda {

// out[k] = images[indices[k]] (kPixels floats each), out_labels[k] = labels[indices[k]],
// for k < n.
cudaError_t gather(const float* images, const std::int32_t* labels, const std::int32_t* indices,
                   int n, int pixels, float* out, std::int32_t* out_labels, cudaStream_t stream);

// y (rows x cols) += bias per row; then y = max(y, 0) when relu.
cudaError_t add_bias(float* y, const float* bias, int rows, int cols, bool relu,
                     cudaStream_t stream);

// grad[k] = 0 where activation[k] <= 0 (the ReLU that produced `activation`), k < n.
cudaError_t relu_backward(float* grad, const float* activation, std::size_t n, cudaStream_t stream);

// grad_bias[c] = sum over rows of grad_out[r][c] (rows x cols): overwrites.
cudaError_t bias_gradient(const float* grad_out, int rows, int cols, float* grad_bias,
                          cudaStream_t stream);

// Mean softmax cross-entropy of logits (rows x classes) against labels into *loss, and
// d loss / d logits = (softmax - one-hot) / rows into grad. Deterministic (one block).
cudaError_t softmax_cross_entropy(const float* logits, const std::int32_t* labels, int rows,
                                  int classes, float* grad, double* loss, cudaStream_t stream);

// sums[0] += summed cross-entropy, sums[1] += rows whose arg-max is the label.
cudaError_t evaluate_batch(const float* logits, const std::int32_t* labels, int rows, int classes,
                           double* sums, cudaStream_t stream);

// torch.optim.SGD with momentum: buf = momentum * buf + grad; param -= lr * buf.
cudaError_t sgd_momentum(float* param, const float* grad, float* buf, std::size_t n, float lr,
                         float momentum, cudaStream_t stream);

}  // namespace fmnist::cuda
