#pragma once
// The backend behind a Context: Gloo (CPU memory) or NCCL (GPU memory). Untyped; the typed
// surface is on Context.
//
// Threading: one thread issues the collectives of a communicator (as with PyTorch process
// groups); every rank must issue the same collectives in the same order. Asynchronous
// operations run in issue order. Buffers must stay alive until the returned Work completed.
// Gloo: after a collective fails (a timeout, a lost peer, a mismatch) the communicator is broken:
// every later call fails with that first error. NCCL: a watchdog thread aborts the
// communicator when a collective passes its timeout or NCCL reports an asynchronous error;
// every pending and later call then fails with that reason. abort() does the same on demand.

#include <cstddef>
#include <memory>
#include <optional>
#include <string>

#include "ddp/types.hpp"
#include "ddp/work.hpp"

namespace ddp {

namespace detail {
class CollectiveRecorder;
}

// Per-call options.
struct CollectiveOptions {
  // GPU only: a cudaStream_t whose queued work must finish before the collective starts
  // (ordered by an event, never a host sync). nullptr: the default stream.
  void* after_stream = nullptr;
  // allreduce of F32 data only: reduce in this 16-bit type (F16 or BF16) to halve the
  // traffic; the result is converted back into the F32 buffer. Unset: reduce in F32.
  std::optional<DType> wire_dtype;
  // allreduce: the Reducer bucket this call reduces, recorded with the collective (the
  // collective record, see docs/runtime.md) so that a hang report can name it. Unset: none.
  std::optional<std::size_t> bucket;
};

// When calls are compared across ranks (a cheap collective of a few integers).
enum class MismatchCheck {
  Off,        // never
  FirstCall,  // the first collective of the communicator (the default)
  Always,     // every collective: a debugging aid, it costs one small exchange per call
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual Backend backend() const = 0;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;

  // In place over `count` elements of `data`.
  virtual Work allreduce(void* data, std::size_t count, DType dtype, ReduceOp op,
                         const CollectiveOptions& options = {}) = 0;
  // In place: root's `count` elements end up in every rank's `data`.
  virtual Work broadcast(void* data, std::size_t count, DType dtype, int root,
                         const CollectiveOptions& options = {}) = 0;
  // `out` holds world_size() * count elements, rank r's input at r * count.
  virtual Work allgather(const void* in, void* out, std::size_t count, DType dtype,
                         const CollectiveOptions& options = {}) = 0;
  // `in` holds world_size() * count elements; `out` gets this rank's reduced slice of count.
  virtual Work reduce_scatter(const void* in, void* out, std::size_t count, DType dtype,
                              ReduceOp op, const CollectiveOptions& options = {}) = 0;
  virtual Work barrier() = 0;

  // Zeroed memory of the kind the collectives work on (host for Gloo, device for NCCL),
  // freed when the last copy of the pointer goes.
  virtual std::shared_ptr<void> allocate(std::size_t bytes) = 0;
  // Zeroes bytes at data, ordered on `stream` (GPU) or at once (CPU).
  virtual void fill_zero(void* data, std::size_t bytes, void* stream = nullptr) = 0;

  // Sets when calls are compared across ranks (see MismatchCheck).
  virtual void set_mismatch_check(MismatchCheck check) = 0;

  // Ends this communicator's communication, e.g. for a rank that is stuck behind a lost peer
  // or is about to exit on an error. Every Work not yet complete and every later call fails
  // with CommError carrying `reason`; the first reason is kept, later aborts do nothing.
  // Thread-safe: meant to be called from another thread while one is blocked in a wait.
  // NCCL: pending waits fail at once, then ncclCommAbort ends the kernels (so freeing device
  // memory, which synchronises the device, no longer waits for a lost peer). Gloo: queued
  // collectives fail at once; the one running on the communication thread is cut short (the
  // sockets to the peers are shut down, so the peers' collectives with this rank fail too).
  // The communicator can only be destroyed afterwards.
  virtual void abort(const std::string& reason) = 0;

  // GPU: queues on `stream` a guard over `count` floats at `data` (device memory) that,
  // when this communicator has been aborted by the time the guard runs, fills them with NaN.
  // For results the compute stream was ordered after (Work::wait_on_stream): an abort ends a
  // collective early and its buffers hold garbage, which work queued after the guard (an
  // optimizer step, a checkpoint copy) then sees as NaN, never as numbers. Returns whether
  // a guard was queued (false: a CPU backend, whose waits report an abort on the host, or
  // libddp built without its CUDA kernels).
  virtual bool poison_if_aborted(float* data, std::size_t count, void* stream) {
    (void)data;
    (void)count;
    (void)stream;
    return false;
  }
  // GPU: a device-readable int that is nonzero once this communicator was aborted (mapped
  // host memory; a kernel of the program may read it to skip a step); nullptr on CPU.
  virtual const int* abort_flag_on_device() const { return nullptr; }
  // True once abort() began (by the program, the watchdog or a failure). Never blocks.
  virtual bool aborted() const { return false; }

  // Internal to libddp: where this communicator records its collectives (the collective
  // record, docs/runtime.md); nullptr while recording is off. Set by init() before the first
  // collective.
  detail::CollectiveRecorder* recorder() const { return recorder_.get(); }
  virtual void set_recorder(std::shared_ptr<detail::CollectiveRecorder> recorder) {
    recorder_ = std::move(recorder);
  }

 protected:
  std::shared_ptr<detail::CollectiveRecorder> recorder_;
};

}  // namespace ddp
