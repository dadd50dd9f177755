#include "sgd.hpp"

#include <stdexcept>
#include <string>

namespace fmnist {

Sgd::Sgd(double lr, double momentum, const std::vector<std::size_t>& sizes)
    : lr_(static_cast<float>(lr)), momentum_(static_cast<float>(momentum)) {
  for (std::size_t n : sizes) buffers_.emplace_back(n, 0.0f);
}

void Sgd::step(const std::vector<std::span<float>>& params,
               const std::vector<std::span<float>>& grads) {
  if (params.size() != buffers_.size() || grads.size() != buffers_.size()) {
    throw std::invalid_argument("Sgd::step: one parameter and one gradient per buffer");
  }
  for (std::size_t i = 0; i < buffers_.size(); ++i) step(i, params[i], grads[i]);
}

void Sgd::step(std::size_t i, std::span<float> param, std::span<const float> grad) {
  if (i >= buffers_.size() || param.size() != buffers_[i].size() ||
      grad.size() != buffers_[i].size()) {
    throw std::invalid_argument("Sgd::step: parameter " + std::to_string(i) +
                                " unknown or of another size than its buffer");
  }
  float* p = param.data();
  const float* g = grad.data();
  float* b = buffers_[i].data();
  const std::size_t n = buffers_[i].size();
  for (std::size_t k = 0; k < n; ++k) {
    b[k] = momentum_ * b[k] + g[k];
    p[k] -= lr_ * b[k];
  }
}

}  // namespace fmnist
