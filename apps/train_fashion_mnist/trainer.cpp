#include "trainer.hpp"

#include <cblas.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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

void maybe_crash(const TrainConfig& config, const ddp::Context& ctx, long global_step,
                 bool replacement) {
  const int rank = config.crash_rank >= 0 ? config.crash_rank : ctx.world_size() - 1;
  if (global_step == config.crash_at_step && ctx.env().restart_count == 0 && !replacement &&
      ctx.rank() == rank) {
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

// Everything one rank holds while training. The job counts steps: each epoch is its
// training steps (one batch each) and one step that evaluates and ends the epoch. Under
// ddprun --restart_policy=inplace (ddp::InplaceJob) a lost rank is replaced in place: the
// survivors keep their memory, the replacement receives the model and the optimizer's state
// from a survivor, and every rank goes on from the highest committed step.
class Job {
 public:
  Job(const TrainConfig& config, ddp::InplaceJob& job, Dataset data)
      : config_(config),
        job_(job),
        data_(std::move(data)),
        model_(config.seed),
        sgd_(config.lr, config.momentum, sizes_of(model_)),
        out_(job.context().rank() == 0, stdout),
        sampler_(data_.train.size(), job.context().world_size(), job.context().rank(),
                 {.shuffle = true, .seed = config.seed}) {}

  int run();

 private:
  std::uint32_t resume();
  void form(ddp::Context& ctx);  // what uses a generation's Context: the Reducer
  void step(ddp::Context& ctx);  // the job's step job_.step()
  void start_epoch(int epoch);
  void train_batch(ddp::Context& ctx, std::size_t batch_index, long global_step);
  void end_epoch(ddp::Context& ctx, int epoch);
  void update_parameters();
  std::vector<std::byte> save_state();
  void load_state(std::span<const std::byte> bytes);

  const TrainConfig& config_;
  ddp::InplaceJob& job_;
  Dataset data_;
  Mlp model_;
  Sgd sgd_;
  Progress out_;
  ddp::DistributedSampler sampler_;
  std::unique_ptr<ddp::Reducer> reducer_;
  std::vector<std::span<float>> params_, grads_;
  long batches_per_epoch_ = 0;
  // The epoch in progress on this rank: its data order, losses and clock.
  int epoch_ = -1;
  std::vector<std::size_t> order_;
  Batch batch_;
  double loss_sum_ = 0;
  std::size_t losses_ = 0;
  Clock::time_point epoch_start_;
  double train_seconds_ = 0;
};

// Rank 0 reads the newest checkpoint; its parameters, momentum buffers and epoch count are
// broadcast. Returns the epochs already done.
std::uint32_t Job::resume() {
  ddp::Context& ctx = job_.context();
  std::int64_t done = 0;
  if (ctx.rank() == 0 && !config_.checkpoint_dir.empty()) {
    if (ctx.env().restart_count > 0) {
      out_.note("restart " + std::to_string(ctx.env().restart_count) +
                ": looking for a checkpoint in " + config_.checkpoint_dir.string());
    }
    done = load_newest(config_, model_, sgd_, out_);
  }
  ctx.broadcast(std::span<std::int64_t>(&done, 1));
  if (done > 0) {
    for (const auto& p : model_.parameters()) ctx.broadcast(p.value);
    for (auto& b : sgd_.buffers()) ctx.broadcast(std::span<float>(b));
  }
  return static_cast<std::uint32_t>(done);
}

// The Reducer of a generation's Context (its construction copies rank 0's parameters, which
// every rank holds already), and the gradient views the model writes into.
void Job::form(ddp::Context& ctx) {
  std::vector<ddp::Parameter> params;
  for (const auto& p : model_.parameters()) params.push_back({p.name, p.value});
  ddp::ReducerOptions options;
  options.timeout = config_.timeout;
  reducer_ = std::make_unique<ddp::Reducer>(ctx, std::move(params), options);
  reducer_->set_sync(!config_.skip_allreduce);
  params_.clear();
  grads_.clear();
  for (std::size_t i = 0; i < reducer_->size(); ++i) {
    params_.push_back(reducer_->parameter(i).value);
    grads_.push_back(reducer_->grad(i));
  }
  model_.set_gradients(grads_);
}

// The state a replacement receives: the parameters, then the momentum buffers (float32).
std::vector<std::byte> Job::save_state() {
  std::vector<std::byte> bytes;
  auto append = [&](std::span<const float> values) {
    const auto* data = reinterpret_cast<const std::byte*>(values.data());
    bytes.insert(bytes.end(), data, data + values.size_bytes());
  };
  for (const auto& p : model_.parameters()) append(p.value);
  for (const auto& b : sgd_.buffers()) append(b);
  return bytes;
}

void Job::load_state(std::span<const std::byte> bytes) {
  std::size_t at = 0;
  auto take = [&](std::span<float> values) {
    if (at + values.size_bytes() > bytes.size()) {
      throw std::runtime_error("the state received from a survivor is " +
                               std::to_string(bytes.size()) + " bytes, shorter than the model");
    }
    std::memcpy(values.data(), bytes.data() + at, values.size_bytes());
    at += values.size_bytes();
  };
  for (const auto& p : model_.parameters()) take(p.value);
  for (auto& b : sgd_.buffers()) take(std::span<float>(b));
}

// Ends the step after backward: SGD on the averaged gradients. The buckets' all-reduces end
// one after the other (the last one starts only when backward ends), so each bucket's
// parameters are updated as soon as its all-reduce is done, while the later ones still run:
// the same updates as one sgd_.step() after finalize(), in another order. Under in-place
// recovery every all-reduce ends first: a lost peer must fail the step before any parameter
// changed, so that the state stays the committed one.
void Job::update_parameters() {
  const auto& buckets = reducer_->buckets();
  const bool overlap = reducer_->sync() && !job_.recovers();
  if (overlap) {
    for (std::size_t b = 0; b + 1 < buckets.size(); ++b) {
      reducer_->wait_bucket(b);  // its gradients are averaged
      for (std::size_t i : buckets[b].parameters) sgd_.step(i, params_[i], grads_[i]);
    }
  }
  reducer_->finalize();  // every gradient averaged across ranks, in the buckets
  const std::size_t first = overlap ? buckets.size() - 1 : 0;
  for (std::size_t b = first; b < buckets.size(); ++b) {
    for (std::size_t i : buckets[b].parameters) sgd_.step(i, params_[i], grads_[i]);
  }
}

// The data order is drawn before the clock starts, as in the PyTorch script (whose
// pure-Python copy of the sampler takes ~0.06 s an epoch): samples/s times training alone.
void Job::start_epoch(int epoch) {
  sampler_.set_epoch(static_cast<std::uint64_t>(epoch));
  order_ = sampler_.indices();
  epoch_ = epoch;
  loss_sum_ = 0;
  losses_ = 0;
  out_.start_epoch(epoch, config_.epochs,
                   order_.size() * static_cast<std::size_t>(job_.context().world_size()));
  epoch_start_ = Clock::now();
}

void Job::train_batch(ddp::Context& ctx, std::size_t batch_index, long global_step) {
  maybe_crash(config_, ctx, global_step, job_.is_replacement());
  const auto batch_size = static_cast<std::size_t>(config_.batch_size);
  const std::size_t start = batch_index * batch_size;
  const std::size_t n = std::min(batch_size, order_.size() - start);
  batch_.fill(data_.train, std::span(order_).subspan(start, n));
  model_.forward(batch_.images.data(), static_cast<int>(n));
  const double loss =
      model_.backward(batch_.labels, [&](std::size_t i) { reducer_->mark_ready(i); });
  update_parameters();
  loss_sum_ += loss;
  ++losses_;
  if (config_.print_losses && ctx.rank() == 0) {
    std::printf("step %ld loss %.9g\n", global_step, loss);
  }
  out_.update((start + n) * static_cast<std::size_t>(ctx.world_size()),
              loss_sum_ / static_cast<double>(losses_));
}

// The epoch's last step: the mean training loss across ranks (each rank's mean over the
// steps it ran: a replacement's starts where it joined), the test set, the summary line, and
// rank 0's checkpoint.
void Job::end_epoch(ddp::Context& ctx, int epoch) {
  const double train_seconds = std::chrono::duration<double>(Clock::now() - epoch_start_).count();
  // {sum of the ranks' means, ranks with one}: a replacement that joined at the epoch's end
  // has none. Without a recovery this is the Avg of the means, bit for bit.
  double means[2] = {losses_ ? loss_sum_ / static_cast<double>(losses_) : 0.0, losses_ ? 1.0 : 0.0};
  ctx.allreduce(std::span<double>(means, 2), ddp::ReduceOp::Sum);
  const double mean = means[1] > 0 ? means[0] / means[1] : 0.0;
  const Evaluation eval = evaluate(ctx, model_, data_.test);
  const double seconds = std::chrono::duration<double>(Clock::now() - epoch_start_).count();
  out_.end_epoch(epoch_summary(epoch, config_.epochs, mean, eval, seconds,
                               static_cast<double>(sampler_.total_size()) / train_seconds));
  if (ctx.rank() == 0 && !config_.checkpoint_dir.empty()) {
    save(config_, static_cast<std::uint32_t>(epoch + 1), model_, sgd_);
  }
}

void Job::step(ddp::Context& ctx) {
  const long per_epoch = batches_per_epoch_ + 1;
  const int epoch = static_cast<int>(job_.step() / per_epoch);
  const long within = job_.step() % per_epoch;
  if (epoch != epoch_) start_epoch(epoch);
  if (within < batches_per_epoch_) {
    train_batch(ctx, static_cast<std::size_t>(within), epoch * batches_per_epoch_ + within);
  } else {
    end_epoch(ctx, epoch);
  }
  job_.commit();
}

int Job::run() {
  batches_per_epoch_ = first_step_after(1, sampler_.size(), config_.batch_size);
  // A replacement takes the state from a survivor at its first step: no checkpoint, and none
  // of the start-up's collectives, which the others ran long ago.
  if (!job_.is_replacement()) {
    const std::uint32_t done = resume();
    job_.set_step(static_cast<std::int64_t>(done) * (batches_per_epoch_ + 1));
  }
  job_.keep([this] { return save_state(); },
            [this](std::span<const std::byte> bytes) { load_state(bytes); });
  job_.on_context([this](ddp::Context& ctx) { form(ctx); }, [this] { reducer_.reset(); });
  const std::int64_t steps = static_cast<std::int64_t>(config_.epochs) * (batches_per_epoch_ + 1);
  while (job_.step() < steps) {
    if (!job_.attempt([this](ddp::Context& ctx) { step(ctx); })) {
      const long per_epoch = batches_per_epoch_ + 1;
      const long within = job_.step() % per_epoch;
      out_.note("rank " + std::to_string(job_.context().rank()) + ": recovered in place " +
                "(generation " + std::to_string(job_.generation()) + "); going on from epoch " +
                std::to_string(job_.step() / per_epoch + 1) +
                (within < batches_per_epoch_ ? ", batch " + std::to_string(within + 1)
                                             : ", its evaluation"));
    }
  }
  reducer_.reset();  // before the job's Context
  return 0;
}

void check_skip_allreduce(const TrainConfig& config, const ddp::Context& ctx) {
  if (config.skip_allreduce && ctx.world_size() > 1) {
    throw std::invalid_argument(
        "--skip_allreduce is a benchmark hook for one rank: ranks would diverge");
  }
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
    if (cuda) {  // the CUDA loop does not recover in place: ddprun restarts every worker
      ddp::Context ctx = ddp::init(options);
      check_skip_allreduce(config, ctx);
      return run_cuda_job(config, ctx, std::move(data));
    }
    ddp::InplaceJob inplace({.init = options});
    check_skip_allreduce(config, inplace.context());
    Job job(config, inplace, std::move(data));
    return job.run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_fashion_mnist: %s\n", e.what());
    write_error_file(e.what());
    return 1;
  }
}

}  // namespace fmnist
