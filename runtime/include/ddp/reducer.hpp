#pragma once
// ddp::Reducer: PyTorch-DDP-style gradient synchronisation that overlaps backward.
//
// The program registers its parameters in parameter order. The Reducer groups their
// gradients into buckets (in reverse registration order, since backward produces the last
// layers' gradients first), owns one flat buffer per bucket, and hands out views into it:
// backward writes gradients straight into those views. mark_ready(i) says that gradient i
// is complete for this step; a bucket's all-reduce starts as soon as all of its gradients
// are ready, always in bucket order, so every rank issues the same collectives in the same
// order. finalize() waits for the last bucket and leaves averaged gradients in place.
//
// CPU (Gloo): the all-reduces run on the communicator's thread while compute goes on.
// GPU (NCCL): views are device memory; each all-reduce runs on the communicator's stream
// after an event recorded on the compute stream, and finalize() makes the compute stream
// wait, without a host sync.
//
// Threading: one thread calls mark_ready/finalize/zero_grad (the training loop's). The
// Context must outlive the Reducer.

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ddp/context.hpp"

namespace ddp {

struct ReducerOptions {
  double first_bucket_mb = 1.0;  // cap of bucket 0 (the last parameters: it starts first)
  double bucket_cap_mb = 25.0;   // cap of every later bucket
  // F16 or BF16: all-reduce the gradients in 16 bits (half the traffic); unset: fp32.
  // NCCL: through libddp's CUDA kernels (ReducerError when it was built without nvcc).
  std::optional<DType> compression;
  bool broadcast_parameters = true;  // copy rank 0's parameters to every rank at construction
  void* compute_stream = nullptr;    // GPU: the cudaStream_t backward runs on (nullptr: default)
  std::chrono::milliseconds timeout = kDefaultCollectiveTimeout;  // finalize / wait_bucket
};

// A parameter as the Reducer sees it: a name for error messages and its values (host memory
// for Gloo, device memory for NCCL), which give the gradient's size and are broadcast from
// rank 0 at construction.
struct Parameter {
  std::string name;
  std::span<float> value;
};

// Which parameters a bucket holds, and its size.
struct Bucket {
  std::vector<std::size_t> parameters;  // registration indices, in the bucket's order
  std::size_t elements = 0;             // floats in the bucket's flat buffer
};

// When a bucket's all-reduce was issued and when its completion was observed, in the last
// synchronised step.
struct BucketTiming {
  std::chrono::steady_clock::time_point launched;
  std::chrono::steady_clock::time_point completed;
};

class Reducer {
 public:
  // Plans the buckets, checks once through the store that every rank has the same layout
  // (ReducerError with both views otherwise), broadcasts the parameters from rank 0 (unless
  // options say not to) and allocates zeroed gradient buffers.
  Reducer(Context& context, std::vector<Parameter> parameters, ReducerOptions options = {});
  // Waits for all-reduces still in flight.
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // The bucket plan for these sizes (in floats, registration order): reverse order, bucket 0
  // closes once it reaches first_bucket_mb, later ones at bucket_cap_mb; a gradient is never
  // split, so a bucket can pass its cap by its last gradient (PyTorch's rule).
  static std::vector<Bucket> plan_buckets(const std::vector<std::size_t>& sizes,
                                          double first_bucket_mb, double bucket_cap_mb);

  std::size_t size() const { return parameters_.size(); }
  const std::vector<Bucket>& buckets() const { return buckets_; }
  const Parameter& parameter(std::size_t i) const { return parameters_.at(i); }

  // The gradient of parameter i: a view into its bucket's buffer, valid for the Reducer's
  // lifetime. Backward writes (or adds) into it.
  std::span<float> grad(std::size_t i);

  // Gradient i is complete for this step. Starts every bucket that became complete, in
  // bucket order. ReducerError when i was already marked in this step.
  void mark_ready(std::size_t i);

  // Waits (up to options.timeout) for bucket b's all-reduce, which must have been started;
  // afterwards its gradients are averaged. For programs that use early buckets before the
  // end of backward. GPU: blocks the host.
  void wait_bucket(std::size_t b);

  // Ends the step: ReducerError listing the gradients never marked; otherwise waits for the
  // last bucket (GPU: makes the compute stream wait) and leaves averaged gradients in place.
  // In a no_sync step it only checks and resets the marks: gradients stay local. When a
  // bucket's all-reduce failed it still waits for the others, resets the step and rethrows
  // the first failure.
  void finalize();

  // Zeroes every gradient (GPU: on the compute stream). ReducerError while buckets of the
  // current step have started (their buffers belong to the communicator until finalize()).
  void zero_grad();

  // Gradient accumulation: while sync is off, steps skip communication and the program adds
  // each micro-batch's gradients into the views; the next synchronised step all-reduces the
  // sum. The guard turns sync off and restores it when it goes out of scope.
  void set_sync(bool sync) { sync_ = sync; }
  bool sync() const { return sync_; }
  class NoSync {
   public:
    explicit NoSync(Reducer& reducer) : reducer_(reducer), previous_(reducer.sync()) {
      reducer_.set_sync(false);
    }
    ~NoSync() { reducer_.set_sync(previous_); }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    Reducer& reducer_;
    bool previous_;
  };
  [[nodiscard]] NoSync no_sync() { return NoSync(*this); }

  // After an abort (Context::abort, the NCCL watchdog, ddprun's stop request): true, and
  // on GPU the gradients of the step whose all-reduces the abort cut short are NaN on the
  // device. finalize() orders the compute stream after the all-reduces without a host wait,
  // so an abort can come after it returned: it also queues, per bucket, a guard that fills
  // the bucket with NaN when the communicator was aborted by the time the stream reaches it.
  // An optimizer step queued after finalize() then produces NaN, never plausible numbers; a
  // program that must not touch its parameters at all (an "on error, save a checkpoint"
  // handler) checks aborted() first, or reads abort_flag_on_device() in its own kernels.
  bool aborted() const;
  // GPU: a device-readable int, nonzero once the communicator was aborted; nullptr on CPU.
  const int* abort_flag_on_device() const;

  // Per bucket, the last synchronised step's timing.
  const std::vector<BucketTiming>& timings() const { return timings_; }

 private:
  void check_layout_across_ranks();
  void broadcast_parameters();
  void launch_ready_buckets();
  void wait_all_launched(bool record);
  // GPU: queues the NaN guard over buckets [0, launched) on the compute stream.
  void guard_against_abort(std::size_t launched);
  void reset_step();
  std::string describe_layout() const;

  Context& context_;
  std::vector<Parameter> parameters_;
  ReducerOptions options_;
  std::vector<Bucket> buckets_;
  std::vector<std::shared_ptr<void>> bucket_memory_;  // one flat buffer per bucket
  std::vector<std::size_t> bucket_of_;                // parameter -> bucket
  std::vector<std::size_t> offset_of_;                // parameter -> offset in its bucket
  std::vector<bool> marked_;                          // this step
  std::vector<std::size_t> pending_;                  // bucket -> gradients not yet ready
  std::vector<Work> works_;                           // bucket -> its all-reduce this step
  std::vector<BucketTiming> timings_;
  std::size_t next_launch_ = 0;  // first bucket not yet started
  bool sync_ = true;
  // The communicator's collective record (step marks), or nullptr when recording is off.
  detail::CollectiveRecorder* recorder_;
};

}  // namespace ddp
