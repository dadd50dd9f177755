#include "trainer.hpp"

#include <cblas.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "checkpoint.hpp"
#include "cuda_trainer.hpp"
#include "ddp/runtime.hpp"
#include "error_file.hpp"
#include "job_common.hpp"
#include "mlp.hpp"
#include "progress.hpp"
#include "sgd.hpp"

namespace fmnist {

std::vector<std::size_t> sizes_of(Mlp& model) {
  std::vector<std::size_t> sizes;
  for (const auto& p : model.parameters()) sizes.push_back(p.value.size());
  return sizes;
}

std::uint32_t load_newest(const TrainConfig& config, Mlp& model, Sgd& sgd, Progress& out) {
  const auto sizes = sizes_of(model);
  std::vector<std::size_t> expected = sizes;
  expected.insert(expected.end(), sizes.begin(), sizes.end());
  for (const auto& path : list_checkpoints(config.checkpoint_dir)) {
    try {
      Checkpoint ck = read_checkpoint(path, expected);
      auto params = model.parameters();
      for (std::size_t i = 0; i < params.size(); ++i) {
        std::copy(ck.tensors[i].begin(), ck.tensors[i].end(), params[i].value.begin());
        sgd.buffers()[i] = std::move(ck.tensors[params.size() + i]);
      }
      out.note("resuming from " + path.string() + " (" + std::to_string(ck.epochs_done) +
               " epochs done)");
      return ck.epochs_done;
    } catch (const CheckpointError& e) {
      out.note(std::string("skipping checkpoint: ") + e.what());
    }
  }
  return 0;
}

void save(const TrainConfig& config, std::uint32_t epochs_done, Mlp& model, Sgd& sgd) {
  std::vector<std::span<const float>> tensors;
  for (const auto& p : model.parameters()) tensors.emplace_back(p.value);
  for (const auto& b : sgd.buffers()) tensors.emplace_back(b);
  write_checkpoint(config.checkpoint_dir, epochs_done, tensors);
}

void maybe_crash(const TrainConfig& config, const ddp::Context& ctx, long global_step) {
  if (global_step == config.crash_at_step && ctx.env().restart_count == 0 &&
      ctx.rank() == ctx.world_size() - 1) {
    std::fprintf(stderr, "train_fashion_mnist: rank %d crashing at step %ld (--crash_at_step)\n",
                 ctx.rank(), global_step);
    std::raise(SIGKILL);
  }
}

long first_step_after(std::uint32_t epochs_done, std::size_t samples_per_rank, int batch_size) {
  const auto batch = static_cast<std::size_t>(batch_size);
  return static_cast<long>(epochs_done) * static_cast<long>((samples_per_rank + batch - 1) / batch);
}

std::string epoch_summary(int epoch, int epochs, double train_loss, const Evaluation& eval,
                          double seconds, double samples_per_second) {
  char line[256];
  std::snprintf(line, sizeof line,
                "epoch %d/%d: train loss %.4f, test loss %.4f, test accuracy %.2f%% "
                "(%zu/%zu), %.1f s, %.0f samples/s",
                epoch + 1, epochs, train_loss, eval.loss,
                100.0 * static_cast<double>(eval.correct) / static_cast<double>(eval.total),
                eval.correct, eval.total, seconds, samples_per_second);
  return line;
}

namespace {

using Clock = std::chrono::steady_clock;

// Test loss and accuracy over the whole test split: each rank evaluates every world-th image
// from its rank on, and the counts are summed across ranks.
Evaluation evaluate(ddp::Context& ctx, Mlp& model, const Split& test) {
  std::vector<float> images;
  std::vector<std::uint8_t> labels;
  double sums[3] = {0, 0, 0};  // loss sum, correct, count
  const auto world = static_cast<std::size_t>(ctx.world_size());
  std::size_t i = static_cast<std::size_t>(ctx.rank());
  while (i < test.size()) {
    images.clear();
    labels.clear();
    for (; i < test.size() && labels.size() < kEvalBatch; i += world) {
      images.insert(images.end(), test.image(i), test.image(i) + kPixels);
      labels.push_back(test.labels[i]);
    }
    const int n = static_cast<int>(labels.size());
    const auto logits = model.forward(images.data(), n);
    sums[0] += softmax_cross_entropy(logits, labels, kClasses, {}) * n;
    for (int r = 0; r < n; ++r) {
      const float* z = logits.data() + r * kClasses;
      sums[1] += static_cast<double>(std::max_element(z, z + kClasses) - z) == labels[r];
    }
    sums[2] += n;
  }
  ctx.allreduce(std::span<double>(sums, 3), ddp::ReduceOp::Sum);
  return {sums[2] > 0 ? sums[0] / sums[2] : 0.0, static_cast<std::size_t>(sums[1]),
          static_cast<std::size_t>(sums[2])};
}

void dump_initial_weights(Mlp& model, const std::filesystem::path& path) {
  std::ofstream out(path, std::ios::binary);
  for (const auto& p : model.parameters()) {
    out.write(reinterpret_cast<const char*>(p.value.data()),
              static_cast<std::streamsize>(p.value.size_bytes()));
  }
  if (!out) throw std::runtime_error(path.string() + ": cannot write the initial weights");
}

// The images and labels of one step, gathered contiguously.
struct Batch {
  std::vector<float> images;
  std::vector<std::uint8_t> labels;
  void fill(const Split& data, std::span<const std::size_t> indices) {
    images.resize(indices.size() * kPixels);
    labels.resize(indices.size());
    for (std::size_t k = 0; k < indices.size(); ++k) {
      std::copy(data.image(indices[k]), data.image(indices[k]) + kPixels,
                images.begin() + static_cast<std::ptrdiff_t>(k * kPixels));
      labels[k] = data.labels[indices[k]];
    }
  }
};

// Everything one rank holds while training.
class Job {
 public:
  Job(const TrainConfig& config, ddp::Context& ctx, Dataset data)
      : config_(config),
        ctx_(ctx),
        data_(std::move(data)),
        model_(config.seed),
        sgd_(config.lr, config.momentum, sizes_of(model_)),
        out_(ctx.rank() == 0, stdout),
        sampler_(data_.train.size(), ctx, {.shuffle = true, .seed = config.seed}) {}

  int run();

 private:
  std::uint32_t resume();
  double train_epoch(int epoch, const std::vector<std::size_t>& order, long& global_step);
  void update_parameters();

  const TrainConfig& config_;
  ddp::Context& ctx_;
  Dataset data_;
  Mlp model_;
  Sgd sgd_;
  Progress out_;
  ddp::DistributedSampler sampler_;
  std::unique_ptr<ddp::Reducer> reducer_;
  std::vector<std::span<float>> params_, grads_;
};

// Rank 0 reads the newest checkpoint; the Reducer then copies its parameters to every rank
// and the momentum buffers and epoch count are broadcast. Returns the epochs already done.
std::uint32_t Job::resume() {
  std::int64_t done = 0;
  if (ctx_.rank() == 0 && !config_.checkpoint_dir.empty()) {
    if (ctx_.env().restart_count > 0) {
      out_.note("restart " + std::to_string(ctx_.env().restart_count) +
                ": looking for a checkpoint in " + config_.checkpoint_dir.string());
    }
    done = load_newest(config_, model_, sgd_, out_);
  }
  ctx_.broadcast(std::span<std::int64_t>(&done, 1));
  std::vector<ddp::Parameter> params;
  for (const auto& p : model_.parameters()) params.push_back({p.name, p.value});
  ddp::ReducerOptions options;
  options.timeout = config_.timeout;
  reducer_ =
      std::make_unique<ddp::Reducer>(ctx_, std::move(params), options);  // broadcasts weights
  reducer_->set_sync(!config_.skip_allreduce);
  if (done > 0) {
    for (auto& b : sgd_.buffers()) ctx_.broadcast(std::span<float>(b));
  }
  for (std::size_t i = 0; i < reducer_->size(); ++i) {
    params_.push_back(reducer_->parameter(i).value);
    grads_.push_back(reducer_->grad(i));
  }
  model_.set_gradients(grads_);
  return static_cast<std::uint32_t>(done);
}

// Ends the step after backward: SGD on the averaged gradients. The buckets' all-reduces end
// one after the other (the last one starts only when backward ends), so each bucket's
// parameters are updated as soon as its all-reduce is done, while the later ones still run:
// the same updates as one sgd_.step() after finalize(), in another order.
void Job::update_parameters() {
  const auto& buckets = reducer_->buckets();
  if (reducer_->sync()) {
    for (std::size_t b = 0; b + 1 < buckets.size(); ++b) {
      reducer_->wait_bucket(b);  // its gradients are averaged
      for (std::size_t i : buckets[b].parameters) sgd_.step(i, params_[i], grads_[i]);
    }
  }
  reducer_->finalize();  // every gradient averaged across ranks, in the buckets
  const std::size_t first = reducer_->sync() ? buckets.size() - 1 : 0;
  for (std::size_t b = first; b < buckets.size(); ++b) {
    for (std::size_t i : buckets[b].parameters) sgd_.step(i, params_[i], grads_[i]);
  }
}

// One epoch over this rank's share (`order`: its sample indices, from the sampler); returns
// the mean training loss across ranks.
double Job::train_epoch(int epoch, const std::vector<std::size_t>& order, long& global_step) {
  const auto world = static_cast<std::size_t>(ctx_.world_size());
  const auto batch_size = static_cast<std::size_t>(config_.batch_size);
  out_.start_epoch(epoch, config_.epochs, order.size() * world);
  Batch batch;
  double loss_sum = 0;
  std::size_t steps = 0;
  for (std::size_t start = 0; start < order.size(); start += batch_size, ++global_step) {
    maybe_crash(config_, ctx_, global_step);
    const std::size_t n = std::min(batch_size, order.size() - start);
    batch.fill(data_.train, std::span(order).subspan(start, n));
    model_.forward(batch.images.data(), static_cast<int>(n));
    const double loss =
        model_.backward(batch.labels, [&](std::size_t i) { reducer_->mark_ready(i); });
    update_parameters();
    loss_sum += loss;
    ++steps;
    if (config_.print_losses && ctx_.rank() == 0) {
      std::printf("step %ld loss %.9g\n", global_step, loss);
    }
    out_.update((start + n) * world, loss_sum / static_cast<double>(steps));
  }
  double mean = steps ? loss_sum / static_cast<double>(steps) : 0.0;
  ctx_.allreduce(std::span<double>(&mean, 1), ddp::ReduceOp::Avg);
  return mean;
}

int Job::run() {
  const std::uint32_t done = resume();
  const std::size_t samples_per_epoch = sampler_.total_size();
  long global_step = first_step_after(done, sampler_.size(), config_.batch_size);
  for (int epoch = static_cast<int>(done); epoch < config_.epochs; ++epoch) {
    // The data order is drawn before the clock starts, as in the PyTorch script (whose
    // pure-Python copy of the sampler takes ~0.06 s an epoch): samples/s times training alone.
    sampler_.set_epoch(static_cast<std::uint64_t>(epoch));
    const std::vector<std::size_t> order = sampler_.indices();
    const auto start = Clock::now();
    const double train_loss = train_epoch(epoch, order, global_step);
    const double train_seconds = std::chrono::duration<double>(Clock::now() - start).count();
    const Evaluation eval = evaluate(ctx_, model_, data_.test);
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    out_.end_epoch(epoch_summary(epoch, config_.epochs, train_loss, eval, seconds,
                                 static_cast<double>(samples_per_epoch) / train_seconds));
    if (ctx_.rank() == 0 && !config_.checkpoint_dir.empty()) {
      save(config_, static_cast<std::uint32_t>(epoch + 1), model_, sgd_);
    }
  }
  return 0;
}

// LOCAL_WORLD_SIZE as the launcher sets it; 1 when run without one.
int ranks_on_this_node() {
  const char* value = std::getenv("LOCAL_WORLD_SIZE");
  const int n = value != nullptr ? std::atoi(value) : 1;
  return n > 0 ? n : 1;
}

Dataset load(const TrainConfig& config) {
  Dataset data = load_dataset(config.data_dir);
  data.train = head(data.train, config.train_limit);
  data.test = head(data.test, config.test_limit);
  normalize(data.train);
  normalize(data.test);
  return data;
}

}  // namespace

int run_training(const TrainConfig& config) {
  openblas_set_num_threads(config.threads);
  std::string why_not_cuda;
  const bool cuda =
      config.device != Device::Cpu && cuda_trainer_usable(ranks_on_this_node(), why_not_cuda);
  if (config.device == Device::Cuda && !cuda) {
    std::fprintf(stderr, "train_fashion_mnist: --device cuda: %s; use --device cpu\n",
                 why_not_cuda.c_str());
    return 2;
  }
  if (!config.dump_init.empty()) {
    Mlp model(config.seed);
    dump_initial_weights(model, config.dump_init);
    return 0;
  }
  try {
    Dataset data = load(config);  // before init: a missing file fails fast on every rank
    ddp::InitOptions options;
    options.backend = cuda ? ddp::Backend::Nccl : ddp::Backend::Gloo;
    options.timeout = config.timeout;
    ddp::Context ctx = ddp::init(options);
    if (config.skip_allreduce && ctx.world_size() > 1) {
      throw std::invalid_argument(
          "--skip_allreduce is a benchmark hook for one rank: ranks would diverge");
    }
    if (cuda) return run_cuda_job(config, ctx, std::move(data));
    Job job(config, ctx, std::move(data));
    return job.run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_fashion_mnist: %s\n", e.what());
    write_error_file(e.what());
    return 1;
  }
}

}  // namespace fmnist
