#pragma once
// The handle of an asynchronous collective.

#include <chrono>
#include <memory>
#include <string>

#include "ddp/types.hpp"

namespace ddp {

namespace detail {
// What a backend implements behind a Work handle. Thread-safe.
class WorkState {
 public:
  virtual ~WorkState() = default;
  // Blocks until the operation finished; false when timeout passed first. Rethrows the
  // operation's failure.
  virtual bool wait_for(std::chrono::milliseconds timeout) = 0;
  // True when finished (successfully or not). Does not block.
  virtual bool done() = 0;
  // Orders later work on a CUDA stream after this operation without blocking the host.
  // The default blocks the host (CPU backends have no streams).
  virtual void wait_on_stream(void* stream, std::chrono::milliseconds timeout);
  // "allreduce(sum, f32 x 1000)": for error messages.
  virtual std::string describe() const = 0;
};
}  // namespace detail

// A collective in flight. Copyable; every copy refers to the same operation. A
// default-constructed Work is already complete. Dropping a Work does not cancel the
// operation; the buffers it uses must stay alive until it completes.
class Work {
 public:
  Work() = default;
  explicit Work(std::shared_ptr<detail::WorkState> state) : state_(std::move(state)) {}

  // Blocks until the operation completed; throws CommError (or the operation's own error)
  // on failure and CommError naming the operation after timeout. NCCL: a wait that times
  // out aborts the communicator (every later call fails); poll with completed() instead.
  // After an abort (Context::abort, the NCCL watchdog) it throws the abort's reason.
  void wait(std::chrono::milliseconds timeout = kDefaultCollectiveTimeout) const;
  // True when the operation completed. Never blocks.
  bool completed() const;
  // GPU: makes `stream` (a cudaStream_t) wait for the operation without a host sync; when
  // the operation has not finished within `timeout`, the watchdog aborts the communicator
  // (the stream then moves on, and the next call or wait throws the reason). Throws at once
  // when the operation already failed. CPU: the same as wait().
  void wait_on_stream(void* stream,
                      std::chrono::milliseconds timeout = kDefaultCollectiveTimeout) const;

 private:
  std::shared_ptr<detail::WorkState> state_;
};

}  // namespace ddp
