#include "ddp/distributed_sampler.hpp"

#include <numeric>
#include <stdexcept>
#include <string>

#include "ddp/context.hpp"
#include "ddp/splitmix64.hpp"

namespace ddp {

DistributedSampler::DistributedSampler(std::size_t dataset_size, int num_replicas, int rank,
                                       DistributedSamplerOptions options)
    : dataset_size_(dataset_size), num_replicas_(num_replicas), rank_(rank), options_(options) {
  if (num_replicas < 1 || rank < 0 || rank >= num_replicas) {
    throw std::invalid_argument("DistributedSampler: rank " + std::to_string(rank) +
                                " is not in [0, " + std::to_string(num_replicas) + ")");
  }
  const auto replicas = static_cast<std::size_t>(num_replicas);
  if (options_.drop_last && dataset_size % replicas != 0) {
    // PyTorch: ceil((len - num_replicas) / num_replicas), i.e. floor(len / num_replicas).
    num_samples_ = dataset_size / replicas;
  } else {
    num_samples_ = (dataset_size + replicas - 1) / replicas;
  }
}

DistributedSampler::DistributedSampler(std::size_t dataset_size, const Context& context,
                                       DistributedSamplerOptions options)
    : DistributedSampler(dataset_size, context.world_size(), context.rank(), options) {}

std::vector<std::size_t> DistributedSampler::indices() const {
  std::vector<std::size_t> all(dataset_size_);
  std::iota(all.begin(), all.end(), std::size_t{0});
  if (options_.shuffle) {
    SplitMix64 rng(options_.seed + epoch_);
    for (std::size_t i = all.size(); i > 1; --i) std::swap(all[i - 1], all[rng.below(i)]);
  }
  const std::size_t total = total_size();
  if (total > all.size() && !all.empty()) {  // pad by wrapping around, as often as needed
    const std::size_t original = all.size();
    for (std::size_t k = 0; all.size() < total; ++k) all.push_back(all[k % original]);
  }
  all.resize(std::min(total, all.size()));
  std::vector<std::size_t> mine;
  mine.reserve(num_samples_);
  for (std::size_t k = static_cast<std::size_t>(rank_); k < all.size();
       k += static_cast<std::size_t>(num_replicas_)) {
    mine.push_back(all[k]);
  }
  return mine;
}

}  // namespace ddp
