#include "cuda_mlp.hpp"

#include <stdexcept>
#include <string>

#include "cuda_kernels.hpp"
#include "fashion_mnist.hpp"

namespace fmnist {

namespace {

constexpr int kDims[4] = {static_cast<int>(kPixels), Mlp::kHidden, Mlp::kHidden, kClasses};

std::string layer_name(int layer) { return "fc" + std::to_string(layer + 1); }

}  // namespace

CudaMlp::CudaMlp(const std::vector<ParameterView>& host, int max_batch, cudaStream_t stream)
    : stream_(stream), max_batch_(max_batch) {
  if (host.size() != 6) throw std::invalid_argument("CudaMlp: 6 parameters expected");
  for (int i = 0; i < 3; ++i) {
    Layer& l = layers_[i];
    l.in = kDims[i];
    l.out = kDims[i + 1];
    l.weight = cuda::DeviceBuffer<float>(static_cast<std::size_t>(l.in) * l.out,
                                         layer_name(i) + ".weight");
    l.bias = cuda::DeviceBuffer<float>(static_cast<std::size_t>(l.out), layer_name(i) + ".bias");
  }
  const auto rows = static_cast<std::size_t>(max_batch);
  hidden_[0] = cuda::DeviceBuffer<float>(rows * Mlp::kHidden, "fc1 activations");
  hidden_[1] = cuda::DeviceBuffer<float>(rows * Mlp::kHidden, "fc2 activations");
  logits_ = cuda::DeviceBuffer<float>(rows * kClasses, "logits");
  grad_out_ = cuda::DeviceBuffer<float>(rows * Mlp::kHidden, "activation gradients");
  grad_in_ = cuda::DeviceBuffer<float>(rows * Mlp::kHidden, "activation gradients");
  cuda::check(cublasCreate(&blas_), "cublasCreate");
  cuda::check(cublasSetStream(blas_, stream_), "cublasSetStream");
  // Plain FP32 products (no TF32): the GPU run then tracks the CPU run and PyTorch's default.
  cuda::check(cublasSetMathMode(blas_, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
  upload(host);
}

CudaMlp::~CudaMlp() {
  if (blas_ != nullptr) cublasDestroy(blas_);
}

std::vector<ParameterView> CudaMlp::parameters() {
  std::vector<ParameterView> views;
  for (int i = 0; i < 3; ++i) {
    Layer& l = layers_[i];
    views.push_back({layer_name(i) + ".weight", {l.weight.data(), l.weight.size()}});
    views.push_back({layer_name(i) + ".bias", {l.bias.data(), l.bias.size()}});
  }
  return views;
}

void CudaMlp::set_gradients(std::vector<std::span<float>> gradients) {
  const auto params = parameters();
  if (gradients.size() != params.size()) {
    throw std::invalid_argument("CudaMlp: 6 gradients expected");
  }
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (gradients[i].size() != params[i].value.size()) {
      throw std::invalid_argument("CudaMlp: gradient of " + params[i].name + " has the wrong size");
    }
  }
  gradients_ = std::move(gradients);
}

// Row-major y (batch x out) = x (batch x in) * W^T. Column-major, that is
// y^T (out x batch) = W_cm^T * x^T with W_cm = W^T (in x out, ld in), x^T (in x batch, ld in).
void CudaMlp::linear_forward(const Layer& l, const float* x, int batch, float* y, bool relu) {
  const float one = 1.0f, zero = 0.0f;
  cuda::check(cublasSgemm(blas_, CUBLAS_OP_T, CUBLAS_OP_N, l.out, batch, l.in, &one,
                          l.weight.data(), l.in, x, l.in, &zero, y, l.out),
              "cublasSgemm (forward, " + std::to_string(l.out) + "x" + std::to_string(l.in) + ")");
  cuda::check(cuda::add_bias(y, l.bias.data(), batch, l.out, relu, stream_), "add_bias kernel");
}

const float* CudaMlp::forward(const float* images, int batch) {
  if (batch > max_batch_ || batch < 0) {
    throw std::invalid_argument("CudaMlp::forward: batch of " + std::to_string(batch) +
                                " above the " + std::to_string(max_batch_) + " it was built for");
  }
  input_ = images;
  batch_ = batch;
  linear_forward(layers_[0], images, batch, hidden_[0].data(), true);
  linear_forward(layers_[1], hidden_[0].data(), batch, hidden_[1].data(), true);
  linear_forward(layers_[2], hidden_[1].data(), batch, logits_.data(), false);
  return logits_.data();
}

// Row-major dW (out x in) = G^T (out x batch) * x (batch x in). Column-major:
// dW^T (in x out, ld in) = x^T (in x batch, ld in) * G (batch x out), where G's column-major
// view G^T is out x batch with ld out, used transposed.
void CudaMlp::linear_backward(int layer, const float* x, const float* grad_out) {
  const Layer& l = layers_[layer];
  std::span<float> grad_w = gradients_[static_cast<std::size_t>(2 * layer)];
  std::span<float> grad_b = gradients_[static_cast<std::size_t>(2 * layer + 1)];
  const float one = 1.0f, zero = 0.0f;
  cuda::check(cublasSgemm(blas_, CUBLAS_OP_N, CUBLAS_OP_T, l.in, l.out, batch_, &one, x, l.in,
                          grad_out, l.out, &zero, grad_w.data(), l.in),
              "cublasSgemm (weight gradient of " + layer_name(layer) + ")");
  cuda::check(cuda::bias_gradient(grad_out, batch_, l.out, grad_b.data(), stream_),
              "bias_gradient kernel of " + layer_name(layer));
}

void CudaMlp::backward(const std::int32_t* labels, double* loss,
                       const std::function<void(std::size_t)>& ready) {
  if (gradients_.empty()) throw std::logic_error("CudaMlp::backward before set_gradients");
  cuda::check(cuda::softmax_cross_entropy(logits_.data(), labels, batch_, kClasses,
                                          grad_out_.data(), loss, stream_),
              "softmax_cross_entropy kernel");
  const float* inputs[3] = {input_, hidden_[0].data(), hidden_[1].data()};
  float* grad_out = grad_out_.data();
  float* grad_in = grad_in_.data();
  for (int layer = 2; layer >= 0; --layer) {
    linear_backward(layer, inputs[layer], grad_out);
    ready(static_cast<std::size_t>(2 * layer + 1));  // bias
    ready(static_cast<std::size_t>(2 * layer));      // weight
    if (layer == 0) break;                           // no gradient for the images
    // Row-major dx (batch x in) = G (batch x out) * W (out x in). Column-major:
    // dx^T (in x batch, ld in) = W_cm (in x out, ld in) * G^T (out x batch, ld out).
    const Layer& l = layers_[layer];
    const float one = 1.0f, zero = 0.0f;
    cuda::check(cublasSgemm(blas_, CUBLAS_OP_N, CUBLAS_OP_N, l.in, batch_, l.out, &one,
                            l.weight.data(), l.in, grad_out, l.out, &zero, grad_in, l.in),
                "cublasSgemm (input gradient of " + layer_name(layer) + ")");
    cuda::check(cuda::relu_backward(grad_in, inputs[layer], static_cast<std::size_t>(batch_) * l.in,
                                    stream_),
                "relu_backward kernel");
    std::swap(grad_out, grad_in);
  }
}

void CudaMlp::download(const std::vector<ParameterView>& host, std::chrono::milliseconds timeout) {
  const auto device = parameters();
  for (std::size_t i = 0; i < device.size(); ++i) {
    cuda::check(cudaMemcpyAsync(host.at(i).value.data(), device[i].value.data(),
                                device[i].value.size_bytes(), cudaMemcpyDeviceToHost, stream_),
                "copying " + device[i].name + " to the host");
  }
  cuda::wait_stream(stream_, timeout, "copying the weights to the host");
}

void CudaMlp::upload(const std::vector<ParameterView>& host) {
  const auto device = parameters();
  for (std::size_t i = 0; i < device.size(); ++i) {
    if (host.at(i).value.size() != device[i].value.size()) {
      throw std::invalid_argument("CudaMlp: " + host[i].name + " has the wrong size");
    }
    cuda::check(cudaMemcpyAsync(device[i].value.data(), host[i].value.data(),
                                device[i].value.size_bytes(), cudaMemcpyHostToDevice, stream_),
                "copying " + device[i].name + " to the device");
  }
}

}  // namespace fmnist
