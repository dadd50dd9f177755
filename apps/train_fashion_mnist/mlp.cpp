#include "mlp.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "ddp/splitmix64.hpp"
#include "fashion_mnist.hpp"

namespace fmnist {

using ddp::SplitMix64;

namespace {

Linear make_linear(int in, int out, SplitMix64& rng) {
  Linear l{in, out, std::vector<float>(static_cast<std::size_t>(in) * out),
           std::vector<float>(static_cast<std::size_t>(out))};
  const double bound = 1.0 / std::sqrt(static_cast<double>(in));
  for (auto& w : l.weight) w = rng.uniform_symmetric(bound);
  for (auto& b : l.bias) b = rng.uniform_symmetric(bound);
  return l;
}

// out (batch x l.out) = in (batch x l.in) * weight^T + bias, then ReLU when asked.
void linear_forward(const Linear& l, const float* in, int batch, float* out, bool relu) {
  for (int r = 0; r < batch; ++r) std::copy(l.bias.begin(), l.bias.end(), out + r * l.out);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, batch, l.out, l.in, 1.0f, in, l.in,
              l.weight.data(), l.in, 1.0f, out, l.out);
  if (relu) {
    std::for_each(out, out + static_cast<std::ptrdiff_t>(batch) * l.out,
                  [](float& v) { v = std::max(v, 0.0f); });
  }
}

// Zeroes the gradient where the ReLU clamped its output (activation <= 0, as PyTorch's
// threshold_backward). A select written on every element, not a conditional store: the signs
// are random, so a branch per element mispredicts half the time, and an unconditional store
// lets the compiler vectorise the loop.
void relu_backward(const float* activation, std::span<float> grad) {
  float* g = grad.data();
  const std::size_t n = grad.size();
  for (std::size_t k = 0; k < n; ++k) g[k] = activation[k] <= 0.0f ? 0.0f : g[k];
}

}  // namespace

Mlp::Mlp(std::uint64_t seed) {
  SplitMix64 rng(seed);
  layers_[0] = make_linear(static_cast<int>(kPixels), kHidden, rng);
  layers_[1] = make_linear(kHidden, kHidden, rng);
  layers_[2] = make_linear(kHidden, kClasses, rng);
}

std::vector<ParameterView> Mlp::parameters() {
  std::vector<ParameterView> views;
  for (int i = 0; i < 3; ++i) {
    const std::string name = "fc" + std::to_string(i + 1);
    views.push_back({name + ".weight", layers_[i].weight});
    views.push_back({name + ".bias", layers_[i].bias});
  }
  return views;
}

void Mlp::set_gradients(std::vector<std::span<float>> gradients) {
  const auto params = parameters();
  if (gradients.size() != params.size()) throw std::invalid_argument("Mlp: 6 gradients expected");
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (gradients[i].size() != params[i].value.size()) {
      throw std::invalid_argument("Mlp: gradient of " + params[i].name + " has the wrong size");
    }
  }
  gradients_ = std::move(gradients);
}

std::span<const float> Mlp::forward(const float* images, int batch) {
  input_ = images;
  batch_ = batch;
  hidden_[0].resize(static_cast<std::size_t>(batch) * kHidden);
  hidden_[1].resize(static_cast<std::size_t>(batch) * kHidden);
  logits_.resize(static_cast<std::size_t>(batch) * kClasses);
  linear_forward(layers_[0], images, batch, hidden_[0].data(), true);
  linear_forward(layers_[1], hidden_[0].data(), batch, hidden_[1].data(), true);
  linear_forward(layers_[2], hidden_[1].data(), batch, logits_.data(), false);
  return logits_;
}

double Mlp::backward(std::span<const std::uint8_t> labels,
                     const std::function<void(std::size_t)>& ready) {
  if (gradients_.empty()) throw std::logic_error("Mlp::backward before set_gradients");
  if (labels.size() != static_cast<std::size_t>(batch_)) {
    throw std::invalid_argument("Mlp::backward: one label per image of the last forward");
  }
  grad_out_.resize(logits_.size());
  const double loss = softmax_cross_entropy(logits_, labels, kClasses, grad_out_);
  const float* inputs[3] = {input_, hidden_[0].data(), hidden_[1].data()};
  for (int layer = 2; layer >= 0; --layer) {
    backward_layer(layer, inputs[layer], grad_out_.data(), batch_);
    ready(static_cast<std::size_t>(2 * layer + 1));  // bias
    ready(static_cast<std::size_t>(2 * layer));      // weight
    if (layer == 0) break;                           // no gradient for the images
    // d loss / d input = grad_out * weight, through the ReLU that produced the input.
    const Linear& l = layers_[layer];
    grad_in_.resize(static_cast<std::size_t>(batch_) * l.in);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, batch_, l.in, l.out, 1.0f,
                grad_out_.data(), l.out, l.weight.data(), l.in, 0.0f, grad_in_.data(), l.in);
    relu_backward(inputs[layer], grad_in_);
    std::swap(grad_out_, grad_in_);
  }
  return loss;
}

// Writes d weight = grad_out^T * input and d bias = column sums of grad_out.
void Mlp::backward_layer(int layer, const float* input, const float* grad_out, int batch) {
  const Linear& l = layers_[layer];
  std::span<float> grad_w = gradients_[static_cast<std::size_t>(2 * layer)];
  std::span<float> grad_b = gradients_[static_cast<std::size_t>(2 * layer + 1)];
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, l.out, l.in, batch, 1.0f, grad_out, l.out,
              input, l.in, 0.0f, grad_w.data(), l.in);
  std::fill(grad_b.begin(), grad_b.end(), 0.0f);
  for (int r = 0; r < batch; ++r) {
    const float* row = grad_out + static_cast<std::ptrdiff_t>(r) * l.out;
    for (int c = 0; c < l.out; ++c) grad_b[static_cast<std::size_t>(c)] += row[c];
  }
}

double softmax_cross_entropy(std::span<const float> logits, std::span<const std::uint8_t> labels,
                             int classes, std::span<float> grad) {
  const std::size_t batch = labels.size();
  double total = 0;
  for (std::size_t r = 0; r < batch; ++r) {
    const float* z = logits.data() + r * static_cast<std::size_t>(classes);
    const float top = *std::max_element(z, z + classes);
    double sum = 0;
    for (int c = 0; c < classes; ++c) sum += std::exp(static_cast<double>(z[c] - top));
    const double log_sum = std::log(sum) + top;
    total += log_sum - z[labels[r]];
    if (grad.empty()) continue;
    float* g = grad.data() + r * static_cast<std::size_t>(classes);
    for (int c = 0; c < classes; ++c) {
      const double p = std::exp(static_cast<double>(z[c]) - log_sum);
      g[c] = static_cast<float>((p - (c == labels[r] ? 1.0 : 0.0)) / static_cast<double>(batch));
    }
  }
  return batch == 0 ? 0.0 : total / static_cast<double>(batch);
}

}  // namespace fmnist
