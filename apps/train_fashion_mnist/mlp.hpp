#pragma once
// The quickstart network on the CPU: 784 -> 512 -> ReLU -> 512 -> ReLU -> 10, softmax
// cross-entropy, matrix products through BLAS. Weights are stored as PyTorch's nn.Linear
// stores them (out x in, row-major), so a checkpoint or an initial-weight dump maps 1:1 onto
// a torch state_dict.
//
// Parameters in registration order: fc1.weight, fc1.bias, fc2.weight, fc2.bias, fc3.weight,
// fc3.bias. Gradients are written into spans the caller supplies (the Reducer's buckets), and
// backward reports each layer's gradients as soon as they are final, last layer first.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace fmnist {

struct Linear {
  int in = 0;
  int out = 0;
  std::vector<float> weight;  // out x in
  std::vector<float> bias;    // out
};

// A named view of one parameter's values.
struct ParameterView {
  std::string name;
  std::span<float> value;
};

class Mlp {
 public:
  static constexpr int kHidden = 512;

  // Weights and biases uniform in +-1/sqrt(in) (the range of PyTorch's nn.Linear default),
  // drawn from a SplitMix64 stream seeded with `seed`, in registration order: the same
  // values on every rank and in examples/pytorch/train_fashion_mnist.py.
  explicit Mlp(std::uint64_t seed);

  std::vector<ParameterView> parameters();
  std::size_t parameter_count() const { return 6; }

  // Where backward writes gradient i (registration order); each span must have the size of
  // parameter i and stay valid while backward runs.
  void set_gradients(std::vector<std::span<float>> gradients);

  // Forward pass over `batch` images (row-major, 784 floats each); returns the logits
  // (batch x 10), valid until the next call. Keeps the activations for backward.
  std::span<const float> forward(const float* images, int batch);

  // Mean softmax cross-entropy of the last forward against `labels`, then backward: writes
  // every gradient (overwriting) and calls ready(i) for each parameter once its gradient is
  // final, in the order fc3.bias, fc3.weight, fc2.bias, fc2.weight, fc1.bias, fc1.weight.
  double backward(std::span<const std::uint8_t> labels,
                  const std::function<void(std::size_t)>& ready);

 private:
  void backward_layer(int layer, const float* input, const float* grad_out, int batch);

  Linear layers_[3];
  std::vector<std::span<float>> gradients_;
  const float* input_ = nullptr;  // the last forward's images
  int batch_ = 0;
  std::vector<float> hidden_[2];  // post-ReLU activations of fc1 and fc2 (batch x 512)
  std::vector<float> logits_;     // batch x 10
  std::vector<float> grad_out_;   // scratch: d loss / d (layer output)
  std::vector<float> grad_in_;    // scratch: d loss / d (layer input)
};

// Mean softmax cross-entropy of logits (batch x classes) against labels; when grad is not
// empty it receives d loss / d logits (softmax - one-hot) / batch.
double softmax_cross_entropy(std::span<const float> logits, std::span<const std::uint8_t> labels,
                             int classes, std::span<float> grad);

}  // namespace fmnist
