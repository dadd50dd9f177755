#include "cuda_trainer.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <numeric>
#include <span>
#include <vector>

#include "cuda_kernels.hpp"
#include "cuda_mlp.hpp"
#include "cuda_sgd.hpp"
#include "cuda_support.hpp"
#include "ddp/runtime.hpp"
#include "error_file.hpp"
#include "job_common.hpp"

namespace fmnist {

namespace {

using Clock = std::chrono::steady_clock;

// Steps between two read-backs of the per-step losses for the progress line: the only host
// waits while an epoch runs (none at all inside a step).
constexpr std::size_t kLossReadEvery = 50;

// A split in device memory: images (n x 784) and labels widened to int32.
struct DeviceSplit {
  cuda::DeviceBuffer<float> images;
  cuda::DeviceBuffer<std::int32_t> labels;
};

DeviceSplit upload(const Split& split, const std::string& name, cudaStream_t stream,
                   std::chrono::milliseconds timeout) {
  DeviceSplit d{cuda::DeviceBuffer<float>(split.images.size(), name + " images"),
                cuda::DeviceBuffer<std::int32_t>(split.size(), name + " labels")};
  const std::vector<std::int32_t> labels(split.labels.begin(), split.labels.end());
  cuda::check(cudaMemcpyAsync(d.images.data(), split.images.data(),
                              split.images.size() * sizeof(float), cudaMemcpyHostToDevice, stream),
              "copying the " + name + " images to the device");
  cuda::check(cudaMemcpyAsync(d.labels.data(), labels.data(), labels.size() * sizeof(std::int32_t),
                              cudaMemcpyHostToDevice, stream),
              "copying the " + name + " labels to the device");
  cuda::wait_stream(stream, timeout, "copying the " + name + " split to the device");
  return d;
}

// Host indices as a device int32 array (the data set has far fewer than 2^31 images).
void upload_indices(const std::vector<std::size_t>& indices, cuda::DeviceBuffer<std::int32_t>& out,
                    cudaStream_t stream, std::chrono::milliseconds timeout) {
  if (out.size() < indices.size())
    out = cuda::DeviceBuffer<std::int32_t>(indices.size(), "indices");
  const std::vector<std::int32_t> narrow(indices.begin(), indices.end());
  cuda::check(cudaMemcpyAsync(out.data(), narrow.data(), narrow.size() * sizeof(std::int32_t),
                              cudaMemcpyHostToDevice, stream),
              "copying the sample order to the device");
  cuda::wait_stream(stream, timeout, "copying the sample order to the device");
}

// Everything one rank holds while training on its GPU. Construct after ddp::init (which made
// the rank's device current).
class CudaJob {
 public:
  CudaJob(const TrainConfig& config, ddp::Context& ctx, Dataset data)
      : config_(config),
        ctx_(ctx),
        timeout_(std::chrono::duration_cast<std::chrono::milliseconds>(config.timeout)),
        data_(std::move(data)),
        host_model_(config.seed),
        host_sgd_(config.lr, config.momentum, sizes_of(host_model_)),
        max_batch_(std::max(config.batch_size, kEvalBatch)),
        model_(host_model_.parameters(), max_batch_, stream_.get()),
        sgd_(config.lr, config.momentum, sizes_of(host_model_), stream_.get()),
        out_(ctx.rank() == 0, stdout),
        sampler_(data_.train.size(), ctx, {.shuffle = true, .seed = config.seed}),
        train_(upload(data_.train, "training", stream_.get(), timeout_)),
        test_(upload(data_.test, "test", stream_.get(), timeout_)),
        batch_images_(static_cast<std::size_t>(max_batch_) * kPixels, "batch images"),
        batch_labels_(static_cast<std::size_t>(max_batch_), "batch labels"),
        eval_sums_(2, "evaluation sums"),
        eval_sums_host_(2, "evaluation sums") {}

  int run();

 private:
  std::uint32_t resume();
  double train_epoch(int epoch, long& global_step);
  Evaluation evaluate();
  void save_checkpoint(std::uint32_t epochs_done);
  // Reads the losses of steps [from, to) of this epoch back to losses_host_.
  void read_losses(std::size_t from, std::size_t to);

  const TrainConfig& config_;
  ddp::Context& ctx_;
  const std::chrono::milliseconds timeout_;
  Dataset data_;
  cuda::Stream stream_;  // the compute stream: every kernel and the Reducer's ordering
  Mlp host_model_;       // the initial weights, and the host side of checkpoints
  Sgd host_sgd_;         // the host side of the momentum buffers in checkpoints
  int max_batch_;
  CudaMlp model_;
  CudaSgd sgd_;
  Progress out_;
  ddp::DistributedSampler sampler_;
  DeviceSplit train_;
  DeviceSplit test_;
  cuda::DeviceBuffer<std::int32_t> order_;       // this epoch's sample order
  cuda::DeviceBuffer<std::int32_t> test_order_;  // the test images this rank evaluates
  std::size_t test_count_ = 0;                   // how many
  cuda::DeviceBuffer<float> batch_images_;
  cuda::DeviceBuffer<std::int32_t> batch_labels_;
  cuda::DeviceBuffer<double> losses_;  // per step of the epoch
  cuda::DeviceBuffer<double> eval_sums_;
  cuda::PinnedBuffer<double> eval_sums_host_;
  std::unique_ptr<cuda::PinnedBuffer<double>> losses_host_;  // per step of the epoch
  std::unique_ptr<ddp::Reducer> reducer_;
  std::vector<std::span<float>> params_, grads_;
};

// Rank 0 reads the newest checkpoint into the host copies and uploads them; the Reducer then
// copies its parameters to every rank, and the momentum buffers and epoch count are
// broadcast. Returns the epochs already done.
std::uint32_t CudaJob::resume() {
  std::int64_t done = 0;
  if (ctx_.rank() == 0 && !config_.checkpoint_dir.empty()) {
    if (ctx_.env().restart_count > 0) {
      out_.note("restart " + std::to_string(ctx_.env().restart_count) +
                ": looking for a checkpoint in " + config_.checkpoint_dir.string());
    }
    done = load_newest(config_, host_model_, host_sgd_, out_);
    if (done > 0) model_.upload(host_model_.parameters());
  }
  ctx_.broadcast(std::span<std::int64_t>(&done, 1));
  std::vector<ddp::Parameter> params;
  for (const auto& p : model_.parameters()) params.push_back({p.name, p.value});
  ddp::ReducerOptions options;
  options.timeout = config_.timeout;
  options.compute_stream = stream_.get();
  reducer_ = std::make_unique<ddp::Reducer>(ctx_, std::move(params), options);  // broadcasts
  reducer_->set_sync(!config_.skip_allreduce);
  if (done > 0) {
    for (auto& b : host_sgd_.buffers()) ctx_.broadcast(std::span<float>(b));
    sgd_.upload(host_sgd_.buffers());
  }
  for (std::size_t i = 0; i < reducer_->size(); ++i) {
    params_.push_back(reducer_->parameter(i).value);
    grads_.push_back(reducer_->grad(i));
  }
  model_.set_gradients(grads_);
  std::vector<std::size_t> mine;  // every world-th test image from this rank on
  for (auto i = static_cast<std::size_t>(ctx_.rank()); i < data_.test.size();
       i += static_cast<std::size_t>(ctx_.world_size())) {
    mine.push_back(i);
  }
  upload_indices(mine, test_order_, stream_.get(), timeout_);
  test_count_ = mine.size();
  return static_cast<std::uint32_t>(done);
}

void CudaJob::read_losses(std::size_t from, std::size_t to) {
  if (to <= from) return;
  cuda::check(cudaMemcpyAsync(losses_host_->data() + from, losses_.data() + from,
                              (to - from) * sizeof(double), cudaMemcpyDeviceToHost, stream_.get()),
              "copying the step losses to the host");
  cuda::wait_stream(stream_.get(), timeout_, "training steps up to " + std::to_string(to));
}

// One epoch on this rank's share; returns the mean training loss across ranks.
double CudaJob::train_epoch(int epoch, long& global_step) {
  sampler_.set_epoch(static_cast<std::uint64_t>(epoch));
  const std::vector<std::size_t> order = sampler_.indices();
  upload_indices(order, order_, stream_.get(), timeout_);
  const auto world = static_cast<std::size_t>(ctx_.world_size());
  const auto batch_size = static_cast<std::size_t>(config_.batch_size);
  const std::size_t steps = (order.size() + batch_size - 1) / batch_size;
  if (losses_.size() < steps) {
    losses_ = cuda::DeviceBuffer<double>(steps, "step losses");
    losses_host_ = std::make_unique<cuda::PinnedBuffer<double>>(steps, "step losses");
  }
  const double* losses = losses_host_->data();
  out_.start_epoch(epoch, config_.epochs, order.size() * world);
  std::size_t read = 0;  // steps whose loss is on the host
  for (std::size_t step = 0; step < steps; ++step, ++global_step) {
    maybe_crash(config_, ctx_, global_step);
    const std::size_t start = step * batch_size;
    const int n = static_cast<int>(std::min(batch_size, order.size() - start));
    cuda::check(cuda::gather(train_.images.data(), train_.labels.data(), order_.data() + start, n,
                             static_cast<int>(kPixels), batch_images_.data(), batch_labels_.data(),
                             stream_.get()),
                "gather kernel");
    model_.forward(batch_images_.data(), n);
    model_.backward(batch_labels_.data(), losses_.data() + step,
                    [&](std::size_t i) { reducer_->mark_ready(i); });
    if (global_step == config_.abort_at_step) {
      ctx_.abort("test hook: --abort_at_step " + std::to_string(global_step));
    }
    reducer_->finalize();  // the compute stream waits for the averaged gradients
    sgd_.step(params_, grads_);
    const bool last = step + 1 == steps;
    if (config_.print_losses || last || step + 1 - read >= kLossReadEvery) {
      read_losses(read, step + 1);
      for (; read <= step; ++read) {
        if (config_.print_losses && ctx_.rank() == 0) {
          std::printf("step %ld loss %.9g\n", global_step - static_cast<long>(step - read),
                      losses[read]);
        }
      }
      const double sum = std::accumulate(losses, losses + read, 0.0);
      out_.update((start + n) * world, sum / static_cast<double>(read));
    }
  }
  double mean =
      steps ? std::accumulate(losses, losses + steps, 0.0) / static_cast<double>(steps) : 0.0;
  ctx_.allreduce(std::span<double>(&mean, 1), ddp::ReduceOp::Avg);
  return mean;
}

// Test loss and accuracy over the whole test split: each rank evaluates its share (every
// world-th image) on the GPU, and the sums are added across ranks.
Evaluation CudaJob::evaluate() {
  cuda::check(cudaMemsetAsync(eval_sums_.data(), 0, 2 * sizeof(double), stream_.get()),
              "zeroing the evaluation sums");
  for (std::size_t start = 0; start < test_count_; start += kEvalBatch) {
    const int n = static_cast<int>(std::min<std::size_t>(kEvalBatch, test_count_ - start));
    cuda::check(cuda::gather(test_.images.data(), test_.labels.data(), test_order_.data() + start,
                             n, static_cast<int>(kPixels), batch_images_.data(),
                             batch_labels_.data(), stream_.get()),
                "gather kernel (test)");
    const float* logits = model_.forward(batch_images_.data(), n);
    cuda::check(cuda::evaluate_batch(logits, batch_labels_.data(), n, kClasses, eval_sums_.data(),
                                     stream_.get()),
                "evaluate_batch kernel");
  }
  cuda::check(cudaMemcpyAsync(eval_sums_host_.data(), eval_sums_.data(), 2 * sizeof(double),
                              cudaMemcpyDeviceToHost, stream_.get()),
              "copying the evaluation sums to the host");
  cuda::wait_stream(stream_.get(), timeout_, "evaluation");
  // loss sum, correct, count
  double sums[3] = {eval_sums_host_[0], eval_sums_host_[1], static_cast<double>(test_count_)};
  ctx_.allreduce(std::span<double>(sums, 3), ddp::ReduceOp::Sum);
  return {sums[2] > 0 ? sums[0] / sums[2] : 0.0, static_cast<std::size_t>(sums[1]),
          static_cast<std::size_t>(sums[2])};
}

// Runs after evaluate() drained the stream, so the copies into pageable memory (which block
// the host until done) wait for nothing but themselves.
void CudaJob::save_checkpoint(std::uint32_t epochs_done) {
  model_.download(host_model_.parameters(), timeout_);
  sgd_.download(host_sgd_.buffers(), timeout_);
  save(config_, epochs_done, host_model_, host_sgd_);
}

int CudaJob::run() {
  const std::uint32_t done = resume();
  const std::size_t samples_per_epoch = sampler_.total_size();
  long global_step = first_step_after(done, sampler_.size(), config_.batch_size);
  for (int epoch = static_cast<int>(done); epoch < config_.epochs; ++epoch) {
    const auto start = Clock::now();
    const double train_loss = train_epoch(epoch, global_step);  // ends with a host wait
    const double train_seconds = std::chrono::duration<double>(Clock::now() - start).count();
    const Evaluation eval = evaluate();
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    out_.end_epoch(epoch_summary(epoch, config_.epochs, train_loss, eval, seconds,
                                 static_cast<double>(samples_per_epoch) / train_seconds));
    if (ctx_.rank() == 0 && !config_.checkpoint_dir.empty()) {
      save_checkpoint(static_cast<std::uint32_t>(epoch + 1));
    }
  }
  cuda::wait_stream(stream_.get(), timeout_, "the last step");
  return 0;
}

}  // namespace

bool cuda_trainer_usable(int ranks_on_node, std::string& why) {
  const int devices = cuda::device_count(why);
  if (devices == 0) return false;
  if (devices < ranks_on_node) {
    why = std::to_string(ranks_on_node) + " ranks on this node but " + std::to_string(devices) +
          " CUDA device(s): one GPU cannot hold two ranks of one NCCL communicator (start at "
          "most " +
          std::to_string(devices) + " per node)";
    return false;
  }
  return true;
}

int run_cuda_job(const TrainConfig& config, ddp::Context& ctx, Dataset data) {
  if (ctx.backend() != ddp::Backend::Nccl) {
    throw std::logic_error("run_cuda_job needs a context on the NCCL backend");
  }
  CudaJob job(config, ctx, std::move(data));
  try {
    return job.run();
  } catch (const std::exception& e) {
    // Here, before `job` frees its device memory: cudaFree synchronises the device, which
    // never finishes behind a collective waiting for a lost peer. The error file first (an
    // abort can take a while), then the abort, which ends those kernels.
    std::fprintf(stderr, "train_fashion_mnist: %s\n", e.what());
    write_error_file(e.what());
    ctx.abort(e.what());
    return 1;
  }
}

}  // namespace fmnist
