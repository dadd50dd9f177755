#pragma once
// The data-parallel training loop of train_fashion_mnist: every rank trains the same MLP on
// its DistributedSampler share of Fashion-MNIST, gradients averaged by ddp::Reducer while
// backward runs, checkpoints each epoch from rank 0, resume from the newest on start.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>

#include "ddp/types.hpp"
#include "fashion_mnist.hpp"

namespace fmnist {

enum class Device { Auto, Cpu, Cuda };

struct TrainConfig {
  std::filesystem::path data_dir = kDefaultDataDir;  // the four IDX files (plain or .gz)
  int batch_size = 128;                              // images per rank per step
  double lr = 0.05;                                  // SGD learning rate
  double momentum = 0.9;                             // SGD momentum
  int epochs = 3;                // passes over the training set, counting resumed ones
  Device device = Device::Auto;  // auto: CUDA when built with it and this node has a GPU per rank
  std::uint64_t seed = 0;        // initial weights and the sampler's shuffle
  std::filesystem::path checkpoint_dir;  // "": no checkpoints, no resume
  std::size_t train_limit = 0;           // use the first N training images (0: all)
  std::size_t test_limit = 0;            // evaluate on the first N test images (0: all)
  int threads = 1;                       // BLAS threads per rank
  // How long a rank waits for the others in any collective (gradient all-reduce, evaluation)
  // before it fails with an error naming the operation; a rank that hangs stops the job then.
  std::chrono::seconds timeout =
      std::chrono::duration_cast<std::chrono::seconds>(ddp::kDefaultCollectiveTimeout);
  bool print_losses = false;        // rank 0 prints "step S loss L" for every step (its batch)
  std::filesystem::path dump_init;  // write the initial weights here (raw float32) and exit
  bool skip_allreduce = false;      // benchmark hook (one rank): the Reducer does not
                                    // communicate, to measure its overhead per step
  long crash_at_step = -1;          // test hook: on the first attempt rank crash_rank kills
                                    // itself (SIGKILL) before this global step
  int crash_rank = -1;              // which rank --crash_at_step kills (-1: the last one)
  long abort_at_step = -1;          // test hook (GPU): every rank aborts its communicator
                                    // (Context::abort) once this step's all-reduces are queued
};

// Runs the whole job under the launcher's environment (ddp::init). Returns the exit code;
// errors a user can fix are printed on stderr with what to do.
int run_training(const TrainConfig& config);

}  // namespace fmnist
