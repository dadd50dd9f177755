#include "nccl_comm_state.hpp"

#include <cuda_runtime.h>

#include <vector>

#include "collective_recorder.hpp"
#include "ddp/types.hpp"
#include "nccl_work.hpp"

namespace ddp::detail {

namespace {

// How often the watchdog looks while collectives are pending, and while none is. Host
// waits poll their own event, so this bounds only how late a deadline or an asynchronous
// error is noticed, not how fast a wait returns.
constexpr std::chrono::milliseconds kBusyInterval(5);
constexpr std::chrono::milliseconds kIdleInterval(100);

}  // namespace

NcclCommState::~NcclCommState() {
  stop_watchdog();
  if (abort_flag_host_ != nullptr) cudaFreeHost(abort_flag_host_);
}

void NcclCommState::make_abort_flag() {
  void* host = nullptr;
  cudaError_t status = cudaHostAlloc(&host, sizeof(int), cudaHostAllocMapped);
  if (status != cudaSuccess) {
    throw CommError(std::string("allocating the abort flag (mapped host memory): ") +
                    cudaGetErrorString(status));
  }
  abort_flag_host_ = static_cast<int*>(host);
  __atomic_store_n(abort_flag_host_, aborting() ? 1 : 0, __ATOMIC_SEQ_CST);
  void* device = nullptr;
  status = cudaHostGetDevicePointer(&device, host, 0);
  if (status != cudaSuccess) {
    throw CommError(std::string("mapping the abort flag into the device: ") +
                    cudaGetErrorString(status));
  }
  abort_flag_device_ = static_cast<const int*>(device);
}

std::string NcclCommState::aborted_because() const {
  std::lock_guard lock(reason_mutex_);
  return reason_;
}

std::exception_ptr NcclCommState::aborted_error(const std::string& what) const {
  return std::make_exception_ptr(
      CommError(what + ": the NCCL communicator was aborted: " + aborted_because()));
}

void NcclCommState::throw_if_aborted(const std::string& what) const {
  if (aborting()) std::rethrow_exception(aborted_error(what));
}

void NcclCommState::begin_abort(const std::string& reason) {
  {
    std::lock_guard lock(reason_mutex_);
    if (!reason_.empty() || aborting_.load()) return;
    reason_ = reason.empty() ? "aborted (no reason given)" : reason;
    aborting_.store(true);  // after reason_: whoever sees the flag finds the reason
  }
  // Before any Work fails and before ncclCommAbort: a poison guard that runs once an aborted
  // collective's event completes sees the flag set.
  if (abort_flag_host_ != nullptr) __atomic_store_n(abort_flag_host_, 1, __ATOMIC_SEQ_CST);
  std::deque<std::shared_ptr<NcclWork>> pending;
  {
    std::lock_guard lock(pending_mutex_);
    pending.swap(pending_);
  }
  for (auto& work : pending) work->finish(aborted_error(work->describe()));
}

void NcclCommState::abort(const std::string& reason) {
  begin_abort(reason);
  std::lock_guard lock(mutex);
  abort_locked(reason);
}

void NcclCommState::abort_locked(const std::string& reason) {
  begin_abort(reason);
  if (comm == nullptr) return;  // aborted already, destroyed, or never built
  ncclCommAbort(comm);
  comm = nullptr;
}

void NcclCommState::watch(std::shared_ptr<NcclWork> work) {
  bool was_idle = false;
  {
    std::lock_guard lock(pending_mutex_);
    if (!aborting()) {
      was_idle = pending_.empty();
      pending_.push_back(std::move(work));
      work = nullptr;
    }
  }
  if (work) {
    work->finish(aborted_error(work->describe()));
    return;
  }
  if (was_idle) wake_.notify_one();  // from the idle interval to the busy one
}

void NcclCommState::start_watchdog(int device) {
  watchdog_ = std::thread([this, device] { watchdog_loop(device); });
}

void NcclCommState::stop_watchdog() {
  if (watchdog_.joinable()) {
    {
      std::lock_guard lock(pending_mutex_);
      stopping_ = true;
    }
    wake_.notify_one();
    watchdog_.join();
  }
  std::deque<std::shared_ptr<NcclWork>> pending;
  {
    std::lock_guard lock(pending_mutex_);
    pending.swap(pending_);  // also ends the Work -> state reference cycle
  }
  for (auto& work : pending) {
    if (!work->poll()) {
      work->finish(std::make_exception_ptr(CommError(
          work->describe() + ": the NCCL communicator was destroyed before it finished")));
    }
  }
}

void NcclCommState::watchdog_loop(int device) {
  cudaSetDevice(device);  // events and the communicator belong to this device
  std::unique_lock lock(pending_mutex_);
  while (!stopping_) {
    wake_.wait_for(lock, pending_.empty() ? kIdleInterval : kBusyInterval);
    if (stopping_) break;
    lock.unlock();
    check_pending();
    check_async_error();
    const CollectiveRecorder* record = stop_request_.load();
    if (record != nullptr && !aborting() && record->stop_requested()) abort(kStopRequestedReason);
    lock.lock();
  }
}

void NcclCommState::check_pending() {
  std::vector<std::shared_ptr<NcclWork>> snapshot;
  {
    std::lock_guard lock(pending_mutex_);
    snapshot.assign(pending_.begin(), pending_.end());
  }
  if (snapshot.empty()) return;
  const auto now = NcclClock::now();
  // One stream: a work cannot finish before those queued ahead of it, so the events are
  // polled up to the first unfinished work; the rest only have their deadlines checked (a
  // later work can have the earlier one, from wait_on_stream).
  std::size_t finished = 0;  // the leading works seen complete, removed below
  while (finished < snapshot.size() && snapshot[finished]->poll()) ++finished;
  for (std::size_t i = finished; i < snapshot.size(); ++i) {
    if (now >= snapshot[i]->deadline()) {
      abort(snapshot[i]->timeout_reason());  // fails every pending work, this one first
      return;
    }
  }
  std::lock_guard lock(pending_mutex_);
  // Only this thread pops, and watch() only appends: the first `finished` are the same.
  for (std::size_t i = 0; i < finished && !pending_.empty(); ++i) pending_.pop_front();
}

void NcclCommState::check_async_error() {
  std::unique_lock lock(mutex, std::try_to_lock);
  if (!lock.owns_lock() || comm == nullptr || aborting()) return;
  ncclResult_t state = ncclSuccess;
  const ncclResult_t status = ncclCommGetAsyncError(comm, &state);
  const ncclResult_t error = status != ncclSuccess ? status : state;
  if (error == ncclSuccess || error == ncclInProgress) return;
  const char* detail = ncclGetLastError(comm);
  std::string reason =
      std::string("NCCL reported an asynchronous error: ") + ncclGetErrorString(error);
  if (detail != nullptr && *detail != '\0') reason += std::string(" (") + detail + ")";
  {
    std::lock_guard pending_lock(pending_mutex_);
    if (!pending_.empty()) reason += " while " + pending_.front()->describe() + " was pending";
  }
  abort_locked(reason);
}

}  // namespace ddp::detail
