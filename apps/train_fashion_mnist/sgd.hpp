#pragma once
// SGD with momentum, as torch.optim.SGD does it (dampening 0, no weight decay, not Nesterov):
//   buf = momentum * buf + grad   (buf = grad on the first step)
//   param -= lr * buf

#include <cstddef>
#include <span>
#include <vector>

namespace fmnist {

class Sgd {
 public:
  // One zeroed momentum buffer per parameter, of these sizes (a zero buffer makes the first
  // step buf = grad, PyTorch's rule).
  Sgd(double lr, double momentum, const std::vector<std::size_t>& sizes);

  // params[i] -= lr * updated buffer i; grads[i] must have the size of params[i].
  void step(const std::vector<std::span<float>>& params,
            const std::vector<std::span<float>>& grads);

  // The same update for parameter i alone (its buffer, param and grad of one size): a
  // step may update its parameters in any order, a few at a time, with the same result.
  void step(std::size_t i, std::span<float> param, std::span<const float> grad);

  // The momentum buffers, for checkpoints (read and restore).
  std::vector<std::vector<float>>& buffers() { return buffers_; }

 private:
  float lr_;
  float momentum_;
  std::vector<std::vector<float>> buffers_;
};

}  // namespace fmnist
