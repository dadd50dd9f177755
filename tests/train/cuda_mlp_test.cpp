// The CUDA model against the CPU one: the same initial weights and batch through CudaMlp
// (cuBLAS + our kernels) and Mlp (OpenBLAS) must give the same logits, loss and gradients,
// and CudaSgd the same update as Sgd. Built with the CUDA trainer; skips with "no CUDA
// device" where none is visible.
//
// Tolerance: both sides compute in FP32 but sum the products in different orders (cuBLAS's
// tiles vs OpenBLAS's), so results differ by rounding only: a few ulps times the square root
// of the inner dimension (784). We allow 1e-4 of each tensor's largest magnitude, about 100
// times that, and far below any real mistake (a transposed or offset product is off by O(1)).
#include "cuda_mlp.hpp"

#include <catch2/catch.hpp>
#include <cmath>
#include <random>
#include <vector>

#include "cuda_device.hpp"
#include "cuda_sgd.hpp"
#include "cuda_support.hpp"
#include "fashion_mnist.hpp"
#include "mlp.hpp"
#include "sgd.hpp"
#include "skip.hpp"
#include "test_support.hpp"

namespace {

using fmnist::cuda::DeviceBuffer;

using ddp::test::to_host;

template <typename T>
DeviceBuffer<T> to_device(const std::vector<T>& host) {
  DeviceBuffer<T> d(host.size(), "test data");
  REQUIRE(cudaMemcpy(d.data(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice) ==
          cudaSuccess);
  return d;
}

// Every element within 1e-4 of the larger tensor's largest magnitude.
void require_close(const std::vector<float>& gpu, const std::vector<float>& cpu,
                   const std::string& what) {
  REQUIRE(gpu.size() == cpu.size());
  float scale = 1e-6f;
  for (float v : cpu) scale = std::max(scale, std::fabs(v));
  float worst = 0;
  std::size_t at = 0;
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    const float d = std::fabs(gpu[i] - cpu[i]);
    if (d > worst) worst = d, at = i;
  }
  INFO(what << ": largest difference " << worst << " at " << at << " (scale " << scale << ")");
  CHECK(worst <= 1e-4f * scale);
}

struct Batch {
  std::vector<float> images;
  std::vector<std::uint8_t> labels;
  std::vector<std::int32_t> labels32;
};

Batch random_batch(int n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> pixel(0.0f, 1.0f);
  std::uniform_int_distribution<int> label(0, fmnist::kClasses - 1);
  Batch b;
  b.images.resize(static_cast<std::size_t>(n) * fmnist::kPixels);
  for (auto& v : b.images) v = pixel(rng);
  for (int i = 0; i < n; ++i) {
    b.labels.push_back(static_cast<std::uint8_t>(label(rng)));
    b.labels32.push_back(b.labels.back());
  }
  return b;
}

}  // namespace

TEST_CASE("CudaMlp: logits, loss, gradients and their order match the CPU Mlp") {
  DDP_SKIP_WITHOUT_GPU();
  const int batch = 37;  // not a multiple of any tile size
  fmnist::Mlp cpu(7);
  fmnist::cuda::Stream stream;
  fmnist::CudaMlp gpu(cpu.parameters(), 64, stream.get());
  const Batch b = random_batch(batch, 1);

  std::vector<std::vector<float>> cpu_grads;
  std::vector<std::span<float>> cpu_views;
  std::vector<DeviceBuffer<float>> gpu_grads;
  std::vector<std::span<float>> gpu_views;
  for (const auto& p : cpu.parameters()) {
    cpu_grads.emplace_back(p.value.size(), 0.0f);
    gpu_grads.emplace_back(p.value.size(), "gradient");
  }
  for (std::size_t i = 0; i < cpu_grads.size(); ++i) {
    cpu_views.emplace_back(cpu_grads[i]);
    gpu_views.emplace_back(gpu_grads[i].data(), gpu_grads[i].size());
  }
  cpu.set_gradients(cpu_views);
  gpu.set_gradients(gpu_views);

  const auto cpu_logits = cpu.forward(b.images.data(), batch);
  const std::vector<float> cpu_logits_copy(cpu_logits.begin(), cpu_logits.end());
  std::vector<std::size_t> cpu_order, gpu_order;
  const double cpu_loss = cpu.backward(b.labels, [&](std::size_t i) { cpu_order.push_back(i); });

  auto images = to_device(b.images);
  auto labels = to_device(b.labels32);
  DeviceBuffer<double> loss(1, "loss");
  const float* gpu_logits = gpu.forward(images.data(), batch);
  gpu.backward(labels.data(), loss.data(), [&](std::size_t i) { gpu_order.push_back(i); });
  fmnist::cuda::wait_stream(stream.get(), ddp::test::build_timeout(std::chrono::seconds(60)),
                            "the test's backward");

  require_close(to_host(gpu_logits, cpu_logits_copy.size()), cpu_logits_copy, "logits");
  double gpu_loss = 0;
  REQUIRE(cudaMemcpy(&gpu_loss, loss.data(), sizeof gpu_loss, cudaMemcpyDeviceToHost) ==
          cudaSuccess);
  CHECK(gpu_loss == Approx(cpu_loss).epsilon(1e-5));
  CHECK(gpu_order == cpu_order);
  const auto names = cpu.parameters();
  for (std::size_t i = 0; i < cpu_grads.size(); ++i) {
    require_close(to_host(gpu_grads[i].data(), gpu_grads[i].size()), cpu_grads[i],
                  "gradient of " + names[i].name);
  }
}

TEST_CASE("CudaSgd: two momentum steps match Sgd") {
  DDP_SKIP_WITHOUT_GPU();
  fmnist::cuda::Stream stream;
  const std::vector<std::size_t> sizes = {1000, 3};
  fmnist::Sgd cpu(0.05, 0.9, sizes);
  fmnist::CudaSgd gpu(0.05, 0.9, sizes, stream.get());
  std::vector<std::vector<float>> params = {std::vector<float>(1000, 0.5f), {1.0f, -2.0f, 3.0f}};
  std::vector<std::vector<float>> grads = {std::vector<float>(1000, 0.25f), {0.1f, 0.2f, -0.3f}};
  std::vector<DeviceBuffer<float>> d_params, d_grads;
  std::vector<std::span<float>> cpu_p, cpu_g, gpu_p, gpu_g;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    d_params.push_back(to_device(params[i]));
    d_grads.push_back(to_device(grads[i]));
    cpu_p.emplace_back(params[i]);
    cpu_g.emplace_back(grads[i]);
    gpu_p.emplace_back(d_params[i].data(), sizes[i]);
    gpu_g.emplace_back(d_grads[i].data(), sizes[i]);
  }
  for (int step = 0; step < 2; ++step) {
    cpu.step(cpu_p, cpu_g);
    gpu.step(gpu_p, gpu_g);
  }
  fmnist::cuda::wait_stream(stream.get(), ddp::test::build_timeout(std::chrono::seconds(60)),
                            "the test's steps");
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    CHECK(to_host(d_params[i].data(), sizes[i]) == params[i]);  // same float operations
  }
  std::vector<std::vector<float>> buffers;
  gpu.download(buffers, ddp::test::build_timeout(std::chrono::seconds(60)));
  CHECK(buffers == cpu.buffers());
}
