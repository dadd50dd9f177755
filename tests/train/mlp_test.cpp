// The MLP's backward against finite differences, the order it reports gradients in, and SGD
// with momentum against PyTorch's update rule (whole, and one parameter at a time).
#include "mlp.hpp"

#include <catch2/catch.hpp>
#include <cmath>

#include "fashion_mnist.hpp"
#include "sgd.hpp"

namespace {

struct Fixture {
  fmnist::Mlp model{7};
  std::vector<std::vector<float>> grads;
  std::vector<float> images;
  std::vector<std::uint8_t> labels{3, 7, 1};
  Fixture() {
    for (const auto& p : model.parameters()) grads.emplace_back(p.value.size());
    std::vector<std::span<float>> views(grads.begin(), grads.end());
    model.set_gradients(views);
    for (std::size_t k = 0; k < 3 * fmnist::kPixels; ++k) {
      images.push_back(static_cast<float>((k * 37) % 101) / 100.0f);
    }
  }
  double loss() {
    const auto logits = model.forward(images.data(), 3);
    return fmnist::softmax_cross_entropy(logits, labels, 10, {});
  }
};

}  // namespace

TEST_CASE("initial weights lie within +-1/sqrt(fan_in) and depend only on the seed") {
  fmnist::Mlp a(1), b(1), c(2);
  const auto pa = a.parameters(), pb = b.parameters(), pc = c.parameters();
  REQUIRE(pa.size() == 6);
  CHECK(pa[0].name == "fc1.weight");
  CHECK(pa[0].value.size() == 512 * 784);
  CHECK(pa[5].value.size() == 10);
  const float bound = 1.0f / std::sqrt(784.0f);
  for (float w : pa[0].value) REQUIRE(std::abs(w) <= bound);
  CHECK(std::equal(pa[0].value.begin(), pa[0].value.end(), pb[0].value.begin()));
  CHECK_FALSE(std::equal(pa[0].value.begin(), pa[0].value.end(), pc[0].value.begin()));
}

TEST_CASE("backward reports gradients last layer first, each once") {
  Fixture f;
  f.model.forward(f.images.data(), 3);
  std::vector<std::size_t> order;
  f.model.backward(f.labels, [&](std::size_t i) { order.push_back(i); });
  CHECK(order == std::vector<std::size_t>{5, 4, 3, 2, 1, 0});
}

TEST_CASE("backward's gradients match finite differences of the loss") {
  Fixture f;
  f.model.forward(f.images.data(), 3);
  const double loss = f.model.backward(f.labels, [](std::size_t) {});
  CHECK(loss == Approx(f.loss()));
  auto params = f.model.parameters();
  // A few entries of every parameter. Central differences with a step of 1e-3 on a float32
  // forward agree with the analytic gradient to about 1e-4 (rounding / step); 1e-3 of margin
  // leaves room. A larger step can cross a ReLU kink (fc2.bias[206] does at 1e-2).
  for (std::size_t p = 0; p < params.size(); ++p) {
    for (std::size_t k = 0; k < params[p].value.size(); k += params[p].value.size() / 5 + 1) {
      float& w = params[p].value[k];
      const float saved = w;
      w = saved + 1e-3f;
      const double up = f.loss();
      w = saved - 1e-3f;
      const double down = f.loss();
      w = saved;
      INFO(params[p].name << "[" << k << "]");
      CHECK(f.grads[p][k] == Approx((up - down) / 2e-3).margin(1e-3));
    }
  }
}

TEST_CASE("softmax cross-entropy of equal logits is log(classes)") {
  const std::vector<float> logits(20, 0.5f);
  const std::vector<std::uint8_t> labels{1, 9};
  std::vector<float> grad(20);
  CHECK(fmnist::softmax_cross_entropy(logits, labels, 10, grad) == Approx(std::log(10.0)));
  CHECK(grad[1] == Approx((0.1 - 1.0) / 2));
  CHECK(grad[0] == Approx(0.1 / 2));
}

TEST_CASE("SGD with momentum follows torch.optim.SGD") {
  std::vector<float> p{1.0f}, g{0.5f};
  fmnist::Sgd sgd(0.1, 0.9, {1});
  std::vector<std::span<float>> ps{p}, gs{g};
  sgd.step(ps, gs);  // buf = 0.5, p = 1 - 0.05
  CHECK(p[0] == Approx(0.95f));
  sgd.step(ps, gs);  // buf = 0.9 * 0.5 + 0.5 = 0.95, p = 0.95 - 0.095
  CHECK(p[0] == Approx(0.855f));
  CHECK(sgd.buffers()[0][0] == Approx(0.95f));
}

TEST_CASE("SGD one parameter at a time, in any order, gives the same bits as one step") {
  std::vector<float> a{1.0f, -2.0f, 0.25f}, b{3.0f}, ga{0.5f, 0.125f, -1.5f}, gb{0.75f};
  std::vector<float> a2 = a, b2 = b;
  fmnist::Sgd whole(0.05, 0.9, {3, 1}), parts(0.05, 0.9, {3, 1});
  std::vector<std::span<float>> ps{a, b}, gs{ga, gb};
  for (int step = 0; step < 3; ++step) {
    whole.step(ps, gs);
    parts.step(1, b2, gb);  // the last parameter first, as the trainer's buckets end
    parts.step(0, a2, ga);
  }
  CHECK(a2 == a);
  CHECK(b2 == b);
  CHECK(parts.buffers() == whole.buffers());
  CHECK_THROWS_AS(parts.step(2, b2, gb), std::invalid_argument);
  CHECK_THROWS_AS(parts.step(0, b2, gb), std::invalid_argument);
}
