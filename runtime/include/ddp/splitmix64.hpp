#pragma once
// SplitMix64: a tiny generator whose every output is fully specified, so that every rank,
// every platform and other languages draw the same numbers from the same seed. The
// DistributedSampler shuffles with it; the example trainer and
// examples/pytorch/train_fashion_mnist.py draw the same initial weights with it.
// The k-th output (k = 1, 2, ...) is mix(seed + k * 0x9e3779b97f4a7c15) mod 2^64.

#include <cstdint>

namespace ddp {

class SplitMix64 {
 public:
  explicit SplitMix64(std::uint64_t seed) : state_(seed) {}

  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }

  // Uniform in [0, bound), bound > 0, without modulo bias (rejection).
  std::uint64_t below(std::uint64_t bound) {
    const std::uint64_t limit = ~std::uint64_t{0} - (~std::uint64_t{0} % bound);
    std::uint64_t x;
    do x = next();
    while (x >= limit);
    return x % bound;
  }

  // (2u - 1) * bound rounded to float, u = the top 24 bits / 2^24 (uniform in [0, 1)).
  float uniform_symmetric(double bound) {
    const double u = static_cast<double>(next() >> 40) * (1.0 / 16777216.0);
    return static_cast<float>((2.0 * u - 1.0) * bound);
  }

 private:
  std::uint64_t state_;
};

}  // namespace ddp
