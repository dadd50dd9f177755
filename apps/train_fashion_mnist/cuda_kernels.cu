#include <algorithm>

#include "cuda_kernels.hpp"

namespace fmnist::cuda {

namespace {

constexpr int kThreads = 256;
constexpr std::size_t kMaxBlocks = 4096;

unsigned blocks_for(std::size_t n) {
  return static_cast<unsigned>(
      std::max<std::size_t>(1, std::min(kMaxBlocks, (n + kThreads - 1) / kThreads)));
}

// The index of this thread in a grid-stride loop, and the stride.
__device__ std::size_t first_index() {
  return static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ std::size_t grid_stride() { return static_cast<std::size_t>(gridDim.x) * blockDim.x; }

__global__ void gather_kernel(const float* images, const std::int32_t* labels,
                              const std::int32_t* indices, int n, int pixels, float* out,
                              std::int32_t* out_labels) {
  const std::size_t total = static_cast<std::size_t>(n) * pixels;
  for (std::size_t i = first_index(); i < total; i += grid_stride()) {
    const std::size_t k = i / pixels;
    const std::size_t p = i % pixels;
    const std::size_t source = static_cast<std::size_t>(indices[k]);
    out[i] = images[source * pixels + p];
    if (p == 0) out_labels[k] = labels[source];
  }
}

__global__ void add_bias_kernel(float* y, const float* bias, int rows, int cols, bool relu) {
  const std::size_t total = static_cast<std::size_t>(rows) * cols;
  for (std::size_t i = first_index(); i < total; i += grid_stride()) {
    const float v = y[i] + bias[i % cols];
    y[i] = relu ? fmaxf(v, 0.0f) : v;
  }
}

__global__ void relu_backward_kernel(float* grad, const float* activation, std::size_t n) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    if (activation[i] <= 0.0f) grad[i] = 0.0f;
  }
}

__global__ void bias_gradient_kernel(const float* grad_out, int rows, int cols, float* grad_bias) {
  for (std::size_t c = first_index(); c < static_cast<std::size_t>(cols); c += grid_stride()) {
    float sum = 0.0f;
    for (int r = 0; r < rows; ++r) sum += grad_out[static_cast<std::size_t>(r) * cols + c];
    grad_bias[c] = sum;
  }
}

// Row r's cross-entropy; writes its gradient row (scaled by 1/scale_rows) when grad is set,
// and says whether its arg-max is the label.
__device__ double row_cross_entropy(const float* z, int label, int classes, float* grad,
                                    int scale_rows, bool* correct) {
  float top = z[0];
  int best = 0;
  for (int c = 1; c < classes; ++c) {
    if (z[c] > top) {
      top = z[c];
      best = c;
    }
  }
  double sum = 0.0;
  for (int c = 0; c < classes; ++c) sum += exp(static_cast<double>(z[c] - top));
  const double log_sum = log(sum) + top;
  if (grad != nullptr) {
    for (int c = 0; c < classes; ++c) {
      const double p = exp(static_cast<double>(z[c]) - log_sum);
      grad[c] = static_cast<float>((p - (c == label ? 1.0 : 0.0)) / scale_rows);
    }
  }
  *correct = best == label;
  return log_sum - z[label];
}

// One block: each thread takes rows t, t + kThreads, ...; the partial sums are added in a
// fixed order, so the result does not depend on scheduling.
__global__ void cross_entropy_kernel(const float* logits, const std::int32_t* labels, int rows,
                                     int classes, float* grad, double* loss, double* sums) {
  __shared__ double partial_loss[kThreads];
  __shared__ double partial_correct[kThreads];
  double my_loss = 0.0, my_correct = 0.0;
  for (int r = threadIdx.x; r < rows; r += kThreads) {
    bool correct = false;
    const std::size_t at = static_cast<std::size_t>(r) * classes;
    my_loss += row_cross_entropy(logits + at, labels[r], classes,
                                 grad != nullptr ? grad + at : nullptr, rows, &correct);
    my_correct += correct ? 1.0 : 0.0;
  }
  partial_loss[threadIdx.x] = my_loss;
  partial_correct[threadIdx.x] = my_correct;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) {
      partial_loss[threadIdx.x] += partial_loss[threadIdx.x + half];
      partial_correct[threadIdx.x] += partial_correct[threadIdx.x + half];
    }
    __syncthreads();
  }
  if (threadIdx.x != 0) return;
  if (loss != nullptr) *loss = rows > 0 ? partial_loss[0] / rows : 0.0;
  if (sums != nullptr) {
    sums[0] += partial_loss[0];
    sums[1] += partial_correct[0];
  }
}

// Rounded multiplies and adds, not fused ones (nvcc would contract a * b + c into an FMA):
// the same float operations as Sgd::step on the CPU, so both give the same bits.
__global__ void sgd_kernel(float* param, const float* grad, float* buf, std::size_t n, float lr,
                           float momentum) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    const float b = __fadd_rn(__fmul_rn(momentum, buf[i]), grad[i]);
    buf[i] = b;
    param[i] = __fsub_rn(param[i], __fmul_rn(lr, b));
  }
}

}  // namespace

cudaError_t gather(const float* images, const std::int32_t* labels, const std::int32_t* indices,
                   int n, int pixels, float* out, std::int32_t* out_labels, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  gather_kernel<<<blocks_for(static_cast<std::size_t>(n) * pixels), kThreads, 0, stream>>>(
      images, labels, indices, n, pixels, out, out_labels);
  return cudaGetLastError();
}

cudaError_t add_bias(float* y, const float* bias, int rows, int cols, bool relu,
                     cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  add_bias_kernel<<<blocks_for(static_cast<std::size_t>(rows) * cols), kThreads, 0, stream>>>(
      y, bias, rows, cols, relu);
  return cudaGetLastError();
}

cudaError_t relu_backward(float* grad, const float* activation, std::size_t n,
                          cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  relu_backward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(grad, activation, n);
  return cudaGetLastError();
}

cudaError_t bias_gradient(const float* grad_out, int rows, int cols, float* grad_bias,
                          cudaStream_t stream) {
  if (cols <= 0) return cudaSuccess;
  bias_gradient_kernel<<<blocks_for(static_cast<std::size_t>(cols)), kThreads, 0, stream>>>(
      grad_out, rows, cols, grad_bias);
  return cudaGetLastError();
}

cudaError_t softmax_cross_entropy(const float* logits, const std::int32_t* labels, int rows,
                                  int classes, float* grad, double* loss, cudaStream_t stream) {
  cross_entropy_kernel<<<1, kThreads, 0, stream>>>(logits, labels, rows, classes, grad, loss,
                                                   nullptr);
  return cudaGetLastError();
}

cudaError_t evaluate_batch(const float* logits, const std::int32_t* labels, int rows, int classes,
                           double* sums, cudaStream_t stream) {
  cross_entropy_kernel<<<1, kThreads, 0, stream>>>(logits, labels, rows, classes, nullptr, nullptr,
                                                   sums);
  return cudaGetLastError();
}

cudaError_t sgd_momentum(float* param, const float* grad, float* buf, std::size_t n, float lr,
                         float momentum, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  sgd_kernel<<<blocks_for(n), kThreads, 0, stream>>>(param, grad, buf, n, lr, momentum);
  return cudaGetLastError();
}

}  // namespace fmnist::cuda
