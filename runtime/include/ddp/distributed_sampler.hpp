#pragma once
// ddp::DistributedSampler: which dataset indices this rank visits in an epoch, as PyTorch's
// torch.utils.data.DistributedSampler decides them.
//
// Every rank gets size() indices: the dataset is padded by wrapping around to a multiple of
// num_replicas (or, with drop_last, cut down to one), and rank r takes every num_replicas-th
// index starting at r. With shuffle off the indices are exactly PyTorch's; with shuffle on
// the permutation depends only on seed + epoch, so it is the same on every rank (our own
// generator: the order differs from PyTorch's randperm, the properties do not).

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ddp {

class Context;

struct DistributedSamplerOptions {
  bool shuffle = true;     // permute the dataset every epoch (PyTorch's default)
  std::uint64_t seed = 0;  // with the epoch, fixes the permutation; same on every rank
  bool drop_last = false;  // cut the tail instead of padding by wrap-around
};

class DistributedSampler {
 public:
  // Throws std::invalid_argument unless 0 <= rank < num_replicas.
  DistributedSampler(std::size_t dataset_size, int num_replicas, int rank,
                     DistributedSamplerOptions options = {});
  // num_replicas and rank from the context.
  DistributedSampler(std::size_t dataset_size, const Context& context,
                     DistributedSamplerOptions options = {});

  // Call at the start of every epoch, on every rank, to change the shuffle.
  void set_epoch(std::uint64_t epoch) { epoch_ = epoch; }
  std::uint64_t epoch() const { return epoch_; }

  // Indices per rank per epoch (PyTorch's num_samples).
  std::size_t size() const { return num_samples_; }
  // size() * num_replicas.
  std::size_t total_size() const { return num_samples_ * num_replicas_; }

  // This rank's indices for the current epoch.
  std::vector<std::size_t> indices() const;

 private:
  std::size_t dataset_size_;
  int num_replicas_;
  int rank_;
  DistributedSamplerOptions options_;
  std::size_t num_samples_ = 0;
  std::uint64_t epoch_ = 0;
};

}  // namespace ddp
