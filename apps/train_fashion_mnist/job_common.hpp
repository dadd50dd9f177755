#pragma once
// The parts of a training job shared by the CPU loop (trainer.cpp) and the CUDA loop
// (cuda_trainer.cpp): checkpoints through host copies of the model, the crash hook, the
// epoch summary line.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ddp/context.hpp"
#include "mlp.hpp"
#include "progress.hpp"
#include "sgd.hpp"
#include "trainer.hpp"

namespace fmnist {

// Images evaluated per forward pass.
inline constexpr int kEvalBatch = 500;

struct Evaluation {
  double loss = 0;  // mean over the test images
  std::size_t correct = 0;
  std::size_t total = 0;
};

std::vector<std::size_t> sizes_of(Mlp& model);

// Rank 0 loads the newest readable checkpoint into the model and optimizer; skips (with a
// note) ones that fail to read. Returns the epochs it holds (0: none).
std::uint32_t load_newest(const TrainConfig& config, Mlp& model, Sgd& sgd, Progress& out);

// Writes the checkpoint of `epochs_done` epochs (atomically) into config.checkpoint_dir.
void save(const TrainConfig& config, std::uint32_t epochs_done, Mlp& model, Sgd& sgd);

// The --crash_at_step test hook: on the first attempt the --crash_rank rank (the last one by
// default) kills itself at that global step; never a replacement (in-place recovery).
void maybe_crash(const TrainConfig& config, const ddp::Context& ctx, long global_step,
                 bool replacement = false);

// The global step an epoch count starts at (steps of `samples_per_rank` in batches).
long first_step_after(std::uint32_t epochs_done, std::size_t samples_per_rank, int batch_size);

// "epoch 2/3: train loss ..., test accuracy ...%, ... s, ... samples/s".
std::string epoch_summary(int epoch, int epochs, double train_loss, const Evaluation& eval,
                          double seconds, double samples_per_second);

}  // namespace fmnist
