// A complete data-parallel training loop with libddp: linear regression on a synthetic
// dataset, gradients all-reduced by ddp::Reducer while "backward" goes on.
//   ddprun --nproc_per_node=2 build/bin/ddp-example-train --epochs 5
#include <ddp/runtime.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

namespace {

constexpr int kFeatures = 16;
constexpr std::size_t kSamples = 4096;
constexpr std::size_t kBatch = 64;  // per rank

struct Dataset {
  std::vector<float> x;  // kSamples x kFeatures
  std::vector<float> y;  // kSamples
};

// The same data on every rank: generated from a fixed seed (a real program would read files).
Dataset make_dataset() {
  std::mt19937 rng(2024);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> true_w(kFeatures);
  for (auto& w : true_w) w = normal(rng);
  Dataset d{std::vector<float>(kSamples * kFeatures), std::vector<float>(kSamples)};
  for (std::size_t i = 0; i < kSamples; ++i) {
    float dot = 0.5f;  // true bias
    for (int f = 0; f < kFeatures; ++f) {
      d.x[i * kFeatures + f] = normal(rng);
      dot += d.x[i * kFeatures + f] * true_w[f];
    }
    d.y[i] = dot + 0.01f * normal(rng);
  }
  return d;
}

}  // namespace

int main(int argc, char** argv) {
  const int epochs = argc > 2 && std::string(argv[1]) == "--epochs" ? std::atoi(argv[2]) : 5;
  try {
    ddp::Context ctx = ddp::init();
    ddp::Logger log(ctx);
    std::mt19937 rng(ddp::rank_seed(1234, ctx.rank()));  // different on purpose per rank

    Dataset data;
    ddp::rank_zero_first(ctx, [&] { data = make_dataset(); });  // e.g. download once, then read

    // Parameters: random on each rank; the Reducer copies rank 0's to everyone.
    std::normal_distribution<float> init(0.0f, 0.1f);
    std::vector<float> weight(kFeatures), bias(1);
    for (auto& w : weight) w = init(rng);
    ddp::Reducer reducer(ctx, {{"weight", weight}, {"bias", bias}});
    const std::span<float> grad_w = reducer.grad(0);
    const std::span<float> grad_b = reducer.grad(1);

    ddp::DistributedSampler sampler(kSamples, ctx, {.shuffle = true, .seed = 7});
    const float lr = 0.1f;
    for (int epoch = 0; epoch < epochs; ++epoch) {
      sampler.set_epoch(epoch);
      const auto indices = sampler.indices();
      double epoch_loss = 0;
      for (std::size_t start = 0; start + kBatch <= indices.size(); start += kBatch) {
        reducer.zero_grad();
        double loss = 0;
        for (std::size_t k = start; k < start + kBatch; ++k) {  // forward + backward
          const float* x = &data.x[indices[k] * kFeatures];
          float prediction = bias[0];
          for (int f = 0; f < kFeatures; ++f) prediction += weight[f] * x[f];
          const float error = prediction - data.y[indices[k]];
          loss += 0.5 * error * error / kBatch;
          for (int f = 0; f < kFeatures; ++f) grad_w[f] += error * x[f] / kBatch;
          grad_b[0] += error / kBatch;
        }
        reducer.mark_ready(1);  // backward order: the last layer's gradients first
        reducer.mark_ready(0);
        reducer.finalize();     // averaged over ranks, in place
        for (int f = 0; f < kFeatures; ++f) weight[f] -= lr * grad_w[f];
        bias[0] -= lr * grad_b[0];
        epoch_loss += loss;
      }
      double mean_loss = epoch_loss / static_cast<double>(indices.size() / kBatch);
      ctx.allreduce(std::span<double>(&mean_loss, 1), ddp::ReduceOp::Avg);
      log.info("epoch ", epoch, " loss ", mean_loss);
    }
    // Every rank holds the same parameters: compare a checksum across ranks.
    double checksum = bias[0];
    for (float w : weight) checksum += w;
    double low = checksum, high = checksum;
    ctx.allreduce(std::span<double>(&low, 1), ddp::ReduceOp::Min);
    ctx.allreduce(std::span<double>(&high, 1), ddp::ReduceOp::Max);
    log.info("parameters equal on all ranks: ", low == high ? "yes" : "NO");
    return low == high ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp-example-train: %s\n", e.what());
    return 1;
  }
}
