#include "ddp/reducer.hpp"

#include <cmath>
#include <exception>

#include "collective_recorder.hpp"

namespace ddp {

namespace {

using Clock = std::chrono::steady_clock;

std::size_t cap_bytes(double megabytes) {
  return static_cast<std::size_t>(std::max(0.0, megabytes) * 1024.0 * 1024.0);
}

std::string name_of(const Parameter& parameter, std::size_t i) {
  std::string name = "'";
  if (parameter.name.empty()) {
    name += '#';
    name += std::to_string(i);
  } else {
    name += parameter.name;
  }
  name += "' (index ";
  name += std::to_string(i);
  name += ')';
  return name;
}

}  // namespace

std::vector<Bucket> Reducer::plan_buckets(const std::vector<std::size_t>& sizes,
                                          double first_bucket_mb, double bucket_cap_mb) {
  std::vector<Bucket> buckets;
  Bucket current;
  for (std::size_t k = sizes.size(); k-- > 0;) {
    current.parameters.push_back(k);
    current.elements += sizes[k];
    const double cap = buckets.empty() ? first_bucket_mb : bucket_cap_mb;
    if (current.elements * sizeof(float) >= cap_bytes(cap)) {
      buckets.push_back(std::move(current));
      current = Bucket{};
    }
  }
  if (!current.parameters.empty()) buckets.push_back(std::move(current));
  return buckets;
}

Reducer::Reducer(Context& context, std::vector<Parameter> parameters, ReducerOptions options)
    : context_(context),
      parameters_(std::move(parameters)),
      options_(options),
      recorder_(context.communicator().recorder()) {
  if (options_.compression && *options_.compression != DType::F16 &&
      *options_.compression != DType::BF16) {
    throw ReducerError(std::string("compression to ") + to_string(*options_.compression) +
                       ": only f16 or bf16");
  }
#if !defined(DDP_HAVE_CUDA_KERNELS)
  if (options_.compression && context_.backend() == Backend::Nccl) {
    throw ReducerError(std::string("compression to ") + to_string(*options_.compression) +
                       " with the nccl backend needs libddp built with nvcc (CUDA kernels)");
  }
#endif
  std::vector<std::size_t> sizes;
  for (const auto& p : parameters_) sizes.push_back(p.value.size());
  buckets_ = plan_buckets(sizes, options_.first_bucket_mb, options_.bucket_cap_mb);
  bucket_of_.resize(size());
  offset_of_.resize(size());
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    std::size_t offset = 0;
    for (std::size_t i : buckets_[b].parameters) {
      bucket_of_[i] = b;
      offset_of_[i] = offset;
      offset += sizes[i];
    }
  }
  check_layout_across_ranks();
  if (options_.broadcast_parameters) broadcast_parameters();
  Communicator& comm = context_.communicator();
  for (const auto& bucket : buckets_) {
    bucket_memory_.push_back(comm.allocate(bucket.elements * sizeof(float)));
  }
  works_.resize(buckets_.size());
  timings_.resize(buckets_.size());
  reset_step();
}

Reducer::~Reducer() {
  for (auto& work : works_) {
    try {
      work.wait(options_.timeout);
    } catch (const std::exception&) {
      // Destructors do not throw; the failure was or will be reported by finalize().
    }
  }
}

std::string Reducer::describe_layout() const {
  std::string text = std::to_string(size()) + " gradients [";
  for (std::size_t i = 0; i < size(); ++i) {
    if (i) text += ',';
    text += std::to_string(parameters_[i].value.size());
  }
  text += "] in " + std::to_string(buckets_.size()) + " buckets [";
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    if (b) text += ',';
    text += std::to_string(buckets_[b].elements);
  }
  // The wire type is part of the layout: ranks that disagree on it would reduce different
  // byte counts (a hang) or mix f32 and 16-bit bytes (garbage).
  text += "] reduced in ";
  text += options_.compression ? to_string(*options_.compression) : "f32";
  return text;
}

// Every rank publishes its layout and reads everybody's: all ranks see a mismatch and fail
// together, before any bucket collective could hang on it.
void Reducer::check_layout_across_ranks() {
  store::Store& store = context_.store();
  const std::string rank = std::to_string(context_.rank());
  const auto instance = store.add("reducer/instances/rank_" + rank, 1);
  const std::string prefix = "reducer/" + std::to_string(instance) + "/layout/";
  const std::string mine = describe_layout();
  store.set(prefix + rank, mine);
  std::vector<std::string> keys;
  for (int r = 0; r < context_.world_size(); ++r) keys.push_back(prefix + std::to_string(r));
  const auto layouts = store.multi_get(keys);
  for (int r = 0; r < context_.world_size(); ++r) {
    if (layouts[r] != mine) {
      throw ReducerError("the Reducer's bucket layout differs across ranks:\n  rank " +
                         std::to_string(r) + ": " + layouts[r] + "\n  rank " + rank + ": " + mine);
    }
  }
}

void Reducer::broadcast_parameters() {
  Communicator& comm = context_.communicator();
  std::vector<Work> works;
  for (const auto& p : parameters_) {
    works.push_back(
        comm.broadcast(p.value.data(), p.value.size(), DType::F32, 0,
                       CollectiveOptions{options_.compute_stream, std::nullopt, std::nullopt}));
  }
  for (auto& work : works) work.wait_on_stream(options_.compute_stream, options_.timeout);
}

std::span<float> Reducer::grad(std::size_t i) {
  if (i >= size()) {
    throw ReducerError("grad(" + std::to_string(i) + "): only " + std::to_string(size()) +
                       " parameters are registered");
  }
  auto* base = static_cast<float*>(bucket_memory_[bucket_of_[i]].get());
  return {base + offset_of_[i], parameters_[i].value.size()};
}

void Reducer::mark_ready(std::size_t i) {
  if (i >= size()) {
    throw ReducerError("mark_ready(" + std::to_string(i) + "): only " + std::to_string(size()) +
                       " parameters are registered");
  }
  if (marked_[i]) {
    throw ReducerError("gradient " + name_of(parameters_[i], i) +
                       " was marked ready twice in one step");
  }
  marked_[i] = true;
  --pending_[bucket_of_[i]];
  if (sync_) {
    if (recorder_ != nullptr) recorder_->step_begin();
    launch_ready_buckets();
  }
}

// Starts the complete buckets at the front of the order; a complete bucket behind an
// incomplete one waits for it, so that every rank issues the same sequence.
void Reducer::launch_ready_buckets() {
  Communicator& comm = context_.communicator();
  CollectiveOptions collective{options_.compute_stream, options_.compression, std::nullopt};
  while (next_launch_ < buckets_.size() && pending_[next_launch_] == 0) {
    const std::size_t b = next_launch_;
    timings_[b].launched = Clock::now();
    collective.bucket = b;
    works_[b] = comm.allreduce(bucket_memory_[b].get(), buckets_[b].elements, DType::F32,
                               ReduceOp::Avg, collective);
    ++next_launch_;  // only once issued: a bucket whose call threw is not counted as started
    // The step's gradients are all ready once its last bucket is issued.
    if (next_launch_ == buckets_.size() && recorder_ != nullptr) recorder_->step_ready();
  }
}

void Reducer::wait_bucket(std::size_t b) {
  if (b >= buckets_.size()) {
    throw ReducerError("wait_bucket(" + std::to_string(b) + "): there are only " +
                       std::to_string(buckets_.size()) + " buckets");
  }
  if (b >= next_launch_) {
    throw ReducerError("wait_bucket(" + std::to_string(b) +
                       "): that bucket's all-reduce "
                       "has not started (" +
                       std::to_string(pending_.at(b)) + " of its gradients are not marked ready)");
  }
  works_[b].wait(options_.timeout);
  timings_[b].completed = Clock::now();
}

void Reducer::finalize() {
  std::vector<std::string> unmarked;
  for (std::size_t i = 0; i < size(); ++i) {
    if (!marked_[i]) unmarked.push_back(name_of(parameters_[i], i));
  }
  if (!unmarked.empty()) {
    std::string list;
    for (std::size_t k = 0; k < unmarked.size() && k < 16; ++k) list += "\n  " + unmarked[k];
    if (unmarked.size() > 16) list += "\n  (and " + std::to_string(unmarked.size() - 16) + " more)";
    try {
      wait_all_launched(false);
    } catch (...) {
      reset_step();
      throw;
    }
    reset_step();
    throw ReducerError("finalize() with " + std::to_string(unmarked.size()) +
                       " gradients never marked ready in this step:" + list);
  }
  try {
    if (sync_) launch_ready_buckets();  // in case sync was turned on after the marks
  } catch (...) {
    try {
      wait_all_launched(false);
    } catch (const std::exception&) {
      // The launch failure is the one to report.
    }
    reset_step();
    throw;
  }
  const std::size_t launched = next_launch_;
  try {
    wait_all_launched(true);
  } catch (...) {
    reset_step();
    throw;
  }
  guard_against_abort(launched);
  reset_step();
  if (recorder_ != nullptr) recorder_->step_finalized();  // no-op after a no_sync step
}

// Waits for every started bucket, even after one failed (its buffers must not be reused
// while a later all-reduce may still write them), then rethrows the first failure.
void Reducer::wait_all_launched(bool record) {
  std::exception_ptr first_failure;
  for (std::size_t b = 0; b < next_launch_; ++b) {
    try {
      if (options_.compute_stream != nullptr || context_.backend() == Backend::Nccl) {
        works_[b].wait_on_stream(options_.compute_stream, options_.timeout);
      } else {
        works_[b].wait(options_.timeout);
      }
    } catch (...) {
      if (!first_failure) first_failure = std::current_exception();
      continue;
    }
    // Keep an earlier observation (wait_bucket) from this step.
    if (record && timings_[b].completed < timings_[b].launched) {
      timings_[b].completed = Clock::now();
    }
  }
  if (first_failure) std::rethrow_exception(first_failure);
}

// GPU: the compute stream now waits for the buckets' all-reduces, on the device. Should the
// communicator be aborted before they finish (a lost peer, the watchdog, ddprun's stop),
// they end early over garbage and the stream goes on: a guard per bucket, queued behind the
// waits, turns such a bucket into NaN before anything later on the stream reads it.
void Reducer::guard_against_abort(std::size_t launched) {
  if (context_.backend() != Backend::Nccl) return;  // CPU: finalize's host wait reports it
  Communicator& comm = context_.communicator();
  for (std::size_t b = 0; b < launched; ++b) {
    comm.poison_if_aborted(static_cast<float*>(bucket_memory_[b].get()), buckets_[b].elements,
                           options_.compute_stream);
  }
}

bool Reducer::aborted() const { return context_.communicator().aborted(); }

const int* Reducer::abort_flag_on_device() const {
  return context_.communicator().abort_flag_on_device();
}

void Reducer::reset_step() {
  marked_.assign(size(), false);
  pending_.assign(buckets_.size(), 0);
  for (std::size_t b = 0; b < buckets_.size(); ++b) pending_[b] = buckets_[b].parameters.size();
  works_.assign(buckets_.size(), Work());
  next_launch_ = 0;
}

void Reducer::zero_grad() {
  if (next_launch_ > 0) {
    throw ReducerError("zero_grad() while " + std::to_string(next_launch_) +
                       " bucket all-reduces of this step are in flight: call finalize() first");
  }
  Communicator& comm = context_.communicator();
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    comm.fill_zero(bucket_memory_[b].get(), buckets_[b].elements * sizeof(float),
                   options_.compute_stream);
  }
}

}  // namespace ddp
