#pragma once
// What a NCCL communicator shares with its Work handles and its watchdog: the ncclComm_t,
// whether (and why) it was aborted, and the collectives queued on its stream that have not
// been seen to finish. Internal to libddp; built only with CUDA + NCCL.
//
// The watchdog is one thread per communicator. Every few milliseconds it polls the CUDA event
// recorded after each queued collective (completing its Work), checks each one's deadline
// (the collective timeout from when it was queued, or a shorter bound from
// Work::wait_on_stream) and reads ncclCommGetAsyncError. A deadline passed or an asynchronous
// NCCL error aborts the communicator with a reason naming the collective. No host callback
// is queued on the stream: a stuck stream holds nothing of the host's. It also obeys the
// agent's stop request in the collective record (ddprun found the job hung): an abort, so
// that a rank stuck in a collective fails with that reason and exits on its own.

#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace ddp::detail {

using NcclClock = std::chrono::steady_clock;

class NcclWork;
class CollectiveRecorder;

// Why the communicator was aborted when the agent asked (RecordPage::stop_requested).
inline constexpr const char* kStopRequestedReason =
    "ddprun found the job hung and stopped it (its report names the rank and the collective "
    "to blame)";

class NcclCommState {
 public:
  NcclCommState() = default;
  // Stops the watchdog if it still runs.
  ~NcclCommState();
  NcclCommState(const NcclCommState&) = delete;
  NcclCommState& operator=(const NcclCommState&) = delete;

  // Held around every NCCL call on `comm` (enqueues, finalize, abort, the watchdog's
  // ncclCommGetAsyncError), so that an abort never races a call into NCCL (NCCL allows one
  // thread at a time per communicator), and around nothing else: never across a CUDA call
  // that can block behind a stuck kernel, which only the abort can end.
  std::mutex mutex;
  ncclComm_t comm = nullptr;  // set once built; null again once aborted or destroyed

  // The issuing thread's way into NCCL: runs call(comm) under `mutex` and returns what it
  // returns; throws aborted_error(what) without calling once an abort began. Blocks only
  // while another NCCL call (or the abort) holds `mutex`.
  template <typename Call>
  auto with_comm(const std::string& what, Call&& call) {
    std::lock_guard lock(mutex);
    throw_if_aborted(what);
    return call(comm);
  }

  // True from the moment an abort starts. Never blocks.
  bool aborting() const { return aborting_.load(); }
  // "" until aborted; then the first abort's reason.
  std::string aborted_because() const;
  // The error every wait and call of `what` fails with after the abort: CommError
  // "<what>: the NCCL communicator was aborted: <reason>".
  std::exception_ptr aborted_error(const std::string& what) const;
  // Throws aborted_error(what) once aborting. Never blocks.
  void throw_if_aborted(const std::string& what) const;

  // Aborts once; the first reason is kept and later calls return at once. In this order:
  // the reason is set, every pending Work fails with it (their waiters wake now, whatever
  // NCCL does next), then ncclCommAbort runs under `mutex` (its kernels exit; an operation
  // still queued behind other work sees NCCL's abort flag when it starts). Thread-safe;
  // blocks while another thread holds `mutex` (an enqueue, which stops waiting once it sees
  // aborting()) and while ncclCommAbort runs.
  void abort(const std::string& reason);
  // The same with `mutex` already held by the caller.
  void abort_locked(const std::string& reason);

  // Hands a collective just queued on the stream to the watchdog (in stream order). Fails
  // it at once when the communicator is aborting.
  void watch(std::shared_ptr<NcclWork> work);

  // The record page whose stop request (the agent found the job hung) the watchdog obeys by
  // aborting with kStopRequestedReason; null: none. The recorder must outlive the watchdog.
  void watch_stop_request(const CollectiveRecorder* recorder) { stop_request_.store(recorder); }

  // Allocates the abort flag: an int of mapped pinned host memory that begin_abort sets to 1
  // with a plain store (no CUDA call: an abort must not wait for a stuck device) and that
  // kernels read through abort_flag_on_device(). Call once, on the communicator's device;
  // throws CommError when CUDA cannot map it.
  void make_abort_flag();
  // The flag's device address; nullptr before make_abort_flag.
  const int* abort_flag_on_device() const { return abort_flag_device_; }

  // Starts the watchdog thread on `device`. Call once, after `comm` is set.
  void start_watchdog(int device);
  // Stops and joins the watchdog, then settles what is still pending: a collective whose
  // event has completed succeeds (unless aborted), any other fails ("destroyed before it
  // finished"). Idempotent.
  void stop_watchdog();

 private:
  void begin_abort(const std::string& reason);  // sets the reason and fails pending works
  void watchdog_loop(int device);
  // One look at the pending works: completes the finished ones, drops them from the list,
  // and aborts past a deadline. Called without pending_mutex_ held.
  void check_pending();
  // Aborts when NCCL reports an asynchronous error; skipped while an enqueue holds `mutex`
  // (the enqueue reads it itself).
  void check_async_error();

  std::atomic<const CollectiveRecorder*> stop_request_{nullptr};
  int* abort_flag_host_ = nullptr;          // mapped pinned memory; freed by the destructor
  const int* abort_flag_device_ = nullptr;  // the same int, as kernels address it
  std::atomic<bool> aborting_{false};
  mutable std::mutex reason_mutex_;
  std::string reason_;  // guarded by reason_mutex_

  std::mutex pending_mutex_;
  std::condition_variable wake_;                   // a new work, or stop
  std::deque<std::shared_ptr<NcclWork>> pending_;  // guarded by pending_mutex_; stream order
  bool stopping_ = false;                          // guarded by pending_mutex_
  std::thread watchdog_;
};

}  // namespace ddp::detail
