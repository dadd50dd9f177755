#include "nccl_communicator.hpp"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "backends.hpp"
#include "collective_recorder.hpp"
#if defined(DDP_HAVE_CUDA_KERNELS)
#include "wire_kernels.hpp"
#endif

namespace ddp::detail {

namespace {

std::string where(int rank) { return " (rank " + std::to_string(rank) + ", nccl)"; }

void cuda_check(cudaError_t status, const std::string& what) {
  if (status != cudaSuccess) throw CommError(what + ": CUDA error: " + cudaGetErrorString(status));
}

void nccl_check(ncclResult_t status, const std::string& what) {
  if (status != ncclSuccess) throw CommError(what + ": NCCL error: " + ncclGetErrorString(status));
}

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return ncclFloat32;
    case DType::F64:
      return ncclFloat64;
    case DType::I32:
      return ncclInt32;
    case DType::I64:
      return ncclInt64;
    case DType::F16:
      return ncclFloat16;
    case DType::BF16:
      return ncclBfloat16;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return ncclSum;
    case ReduceOp::Avg:
      return ncclAvg;
    case ReduceOp::Min:
      return ncclMin;
    case ReduceOp::Max:
      return ncclMax;
  }
  return ncclSum;
}

// Waits for a non-blocking communicator's pending operation (init, an enqueue, finalize) to
// settle. NCCL offers no waitable handle for that state, only ncclCommGetAsyncError, so this
// polls it: a yield first, then sleeps growing to 1 ms (init takes milliseconds to seconds;
// an enqueue usually settles at the first look). Returns ncclSuccess, the communicator's
// error, or ncclInProgress when `deadline` passed first or `owner` began aborting.
ncclResult_t settle(ncclComm_t comm, NcclClock::time_point deadline,
                    const NcclCommState* owner = nullptr) {
  using std::chrono::microseconds;
  microseconds pause{0};
  for (;;) {
    ncclResult_t state = ncclInProgress;
    const ncclResult_t status = ncclCommGetAsyncError(comm, &state);
    if (status != ncclSuccess) return status;
    if (state != ncclInProgress) return state;
    if (NcclClock::now() >= deadline) return ncclInProgress;
    if (owner != nullptr && owner->aborting()) return ncclInProgress;
    if (pause.count() == 0) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(pause);
    }
    pause = std::min(pause * 2 + microseconds(10), microseconds(1000));
  }
}

// NCCL's own words on the last failure of `comm`, as " (...)" or "".
std::string last_error(ncclComm_t comm) {
  const char* text = comm != nullptr ? ncclGetLastError(comm) : nullptr;
  return text != nullptr && *text != '\0' ? std::string(" (") + text + ")" : "";
}

std::chrono::milliseconds remaining(NcclClock::time_point deadline) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - NcclClock::now());
  return std::max(left, std::chrono::milliseconds(0));
}

bool is_device_memory(const void* p) {
  if (p == nullptr) return true;  // count 0: nothing is touched
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, p) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "invalid value" of unregistered memory
    return false;
  }
  return attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
}

// Records collective `seq` as failed unless dismissed (the launch reached the stream).
class RecordFailureGuard {
 public:
  RecordFailureGuard(CollectiveRecorder* recorder, std::uint64_t seq)
      : recorder_(recorder), seq_(seq) {}
  ~RecordFailureGuard() {
    if (recorder_ != nullptr) recorder_->on_finished(seq_, true);
  }
  RecordFailureGuard(const RecordFailureGuard&) = delete;
  RecordFailureGuard& operator=(const RecordFailureGuard&) = delete;
  void dismiss() { recorder_ = nullptr; }

 private:
  CollectiveRecorder* recorder_;
  std::uint64_t seq_;
};

}  // namespace

bool nccl_usable() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return count > 0;
}

std::unique_ptr<Communicator> make_nccl_communicator(std::shared_ptr<store::Store> store,
                                                     const LaunchEnv& env,
                                                     const InitOptions& options,
                                                     MismatchCheck check) {
  return std::make_unique<NcclCommunicator>(std::move(store), env, options, check);
}

NcclCommunicator::NcclCommunicator(std::shared_ptr<store::Store> store, const LaunchEnv& env,
                                   const InitOptions& options, MismatchCheck check)
    : store_(std::move(store)),
      rank_(env.rank),
      world_size_(env.world_size),
      timeout_(options.timeout),
      policy_(check) {
  const std::string me = "rank " + std::to_string(rank_) + " of " + std::to_string(world_size_);
  const auto deadline = NcclClock::now() + options.init_timeout;
  try {
    int count = 0;
    cuda_check(cudaGetDeviceCount(&count), "counting CUDA devices");
    if (count == 0) throw InitError(me + ": the NCCL backend needs a CUDA device; none found");
    device_ = options.cuda_device >= 0 ? options.cuda_device : env.local_rank % count;
    cuda_check(cudaSetDevice(device_), "selecting CUDA device " + std::to_string(device_));
    cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "creating a stream");
    wait_for_all_ranks(deadline, options.init_timeout);
    init_communicator(options, deadline, options.init_timeout);
    ready_ = events_->acquire("ordering the communication stream");
    state_->make_abort_flag();
    {
      std::lock_guard lock(state_->mutex);
      state_->comm = comm_;
    }
    state_->start_watchdog(device_);
  } catch (const InitError&) {
    release();  // no destructor runs for a constructor that throws
    throw;
  } catch (const std::exception& e) {
    release();
    throw InitError(me + ": building the NCCL communicator on device " + std::to_string(device_) +
                    ": " + e.what());
  }
}

NcclCommunicator::~NcclCommunicator() { release(); }

void NcclCommunicator::release() noexcept {
  // A stream stuck behind a collective whose peer is gone never drains: wait for its last
  // operation on the host, with a timeout (a wait that runs out aborts), instead of an
  // unbounded cudaStreamSynchronize.
  bool drained = true;
  if (last_ && !state_->aborting()) {
    try {
      drained = last_->wait_for(timeout_);
    } catch (...) {
      drained = false;  // aborted, or a CUDA error: do not wait for the stream
    }
  }
  // Settles what is still pending; from here on only this thread touches the communicator
  // (or an abort called from another thread, under the mutex).
  state_->stop_watchdog();
  if (comm_ != nullptr || stream_ != nullptr) cudaSetDevice(device_);
  {
    std::lock_guard lock(state_->mutex);
    if (state_->comm != nullptr) {
      // Abort stops kernels that wait for a lost peer; destroy would wait for them.
      if (drained && !state_->aborting()) {
        // Non-blocking: finalize flushes and settles in the background; destroy is then
        // local. A finalize that does not settle in time means a peer is gone: abort.
        const ncclResult_t flushed = ncclCommFinalize(state_->comm);
        if ((flushed == ncclSuccess || flushed == ncclInProgress) &&
            settle(state_->comm, NcclClock::now() + timeout_, state_.get()) == ncclSuccess) {
          ncclCommDestroy(state_->comm);
        } else {
          ncclCommAbort(state_->comm);
          drained = false;
        }
      } else {
        ncclCommAbort(state_->comm);
        drained = false;
      }
      state_->comm = nullptr;
    } else if (comm_ != nullptr && !state_->aborting()) {
      ncclCommAbort(comm_);  // built, but the constructor failed before handing it over
    }
    if (state_->aborting()) drained = false;
    comm_ = nullptr;  // an aborted communicator is freed already
  }
  if (wire_ != nullptr) {
    cudaFreeAsync(wire_, stream_);  // after whatever still reads it
    wire_ = nullptr;
    wire_bytes_ = 0;
  }
  if (stream_ != nullptr) {
    if (drained) cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);  // with work still queued: released once it completes
    stream_ = nullptr;
  }
  ready_.reset();
  last_.reset();
}

void NcclCommunicator::abort(const std::string& reason) { state_->abort(reason); }

bool NcclCommunicator::poison_if_aborted(float* data, std::size_t count, void* stream) {
#if defined(DDP_HAVE_CUDA_KERNELS)
  if (state_->abort_flag_on_device() == nullptr) return false;
  cuda_check(cudaSetDevice(device_), "selecting CUDA device " + std::to_string(device_));
  cuda_check(
      poison_if_aborted_on_stream(state_->abort_flag_on_device(), data, count,
                                  static_cast<cudaStream_t>(stream)),
      "queueing the abort guard over " + std::to_string(count) + " gradients" + where(rank_));
  return true;
#else
  (void)data;
  (void)count;
  (void)stream;
  return false;
#endif
}

std::string NcclCommunicator::ranks_without(const std::string& prefix, int& absent) {
  std::string missing;
  int shown = 0;
  absent = 0;
  for (int r = 0; r < world_size_; ++r) {
    if (store_->check({prefix + std::to_string(r)})) continue;
    ++absent;
    if (shown++ < 16) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
  }
  if (absent > 16) missing += " (and " + std::to_string(absent - 16) + " more)";
  return missing;
}

// Every rank announces itself, then waits for all others: a rank that never comes is named
// instead of leaving NCCL's init waiting for it.
void NcclCommunicator::wait_for_all_ranks(NcclClock::time_point deadline,
                                          std::chrono::milliseconds timeout) {
  store_->set("arrived/" + std::to_string(rank_), "1");
  std::vector<std::string> keys;
  for (int r = 0; r < world_size_; ++r) keys.push_back("arrived/" + std::to_string(r));
  try {
    store_->wait(keys, remaining(deadline));
  } catch (const store::StoreTimeout&) {
    int absent = 0;
    const std::string missing = ranks_without("arrived/", absent);
    throw InitError("rank " + std::to_string(rank_) + ": NCCL init timed out after " +
                    std::to_string(timeout.count()) + " ms: " + std::to_string(absent) +
                    " ranks never arrived: " + missing);
  }
}

void NcclCommunicator::init_communicator(const InitOptions& options, NcclClock::time_point deadline,
                                         std::chrono::milliseconds timeout) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // init returns at once; finish_init waits with our deadline
  const std::string called = "init_called/" + std::to_string(rank_);
  if (world_size_ <= options.nccl_scalable_threshold) {
    ncclUniqueId id{};
    if (rank_ == 0) {
      nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
      store_->set("unique_id", std::string_view(id.internal, sizeof id.internal));
    }
    wait_for_ids({"unique_id"}, deadline, timeout);
    const std::string bytes = store_->get("unique_id");
    std::memcpy(id.internal, bytes.data(), std::min(bytes.size(), sizeof id.internal));
    store_->set(called, "1");
    finish_init(ncclCommInitRankConfig(&comm_, world_size_, id, rank_, &config), deadline, timeout);
    return;
  }
  // Several roots, spread evenly: root i is rank i * world / roots and makes unique id i.
  const int threshold = std::max(1, options.nccl_scalable_threshold);
  const int roots = (world_size_ + threshold - 1) / threshold;
  std::vector<std::string> keys;
  for (int i = 0; i < roots; ++i) {
    keys.push_back("unique_id/" + std::to_string(i));
    if (rank_ == static_cast<int>(static_cast<std::int64_t>(i) * world_size_ / roots)) {
      ncclUniqueId id{};
      nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
      store_->set(keys.back(), std::string_view(id.internal, sizeof id.internal));
    }
  }
  wait_for_ids(keys, deadline, timeout);
  const auto values = store_->multi_get(keys);
  std::vector<ncclUniqueId> ids(roots);
  for (int i = 0; i < roots; ++i) {
    std::memcpy(ids[i].internal, values[i].data(),
                std::min(values[i].size(), sizeof ids[i].internal));
  }
  store_->set(called, "1");
  finish_init(ncclCommInitRankScalable(&comm_, world_size_, rank_, roots, ids.data(), &config),
              deadline, timeout);
}

void NcclCommunicator::wait_for_ids(const std::vector<std::string>& keys,
                                    NcclClock::time_point deadline,
                                    std::chrono::milliseconds timeout) {
  try {
    store_->wait(keys, remaining(deadline));
  } catch (const store::StoreTimeout&) {
    throw InitError("rank " + std::to_string(rank_) + ": NCCL init timed out after " +
                    std::to_string(timeout.count()) +
                    " ms: NCCL's unique id never appeared in the store (the rank that makes it, "
                    "rank 0 or a root of a large world, stopped before publishing it)");
  }
}

void NcclCommunicator::finish_init(ncclResult_t first, NcclClock::time_point deadline,
                                   std::chrono::milliseconds timeout) {
  const std::string me = "rank " + std::to_string(rank_);
  ncclResult_t status = first;
  if (comm_ != nullptr && (first == ncclSuccess || first == ncclInProgress)) {
    status = settle(comm_, deadline);
  }
  if (status == ncclSuccess && comm_ != nullptr) return;
  const std::string detail = last_error(comm_);
  if (comm_ != nullptr) ncclCommAbort(comm_);  // frees the half-built communicator
  comm_ = nullptr;
  if (status != ncclInProgress) {
    throw InitError(me + ": NCCL communicator init failed: " + ncclGetErrorString(status) + detail);
  }
  int absent = 0;
  const std::string missing = ranks_without("init_called/", absent);
  std::string message = me + ": NCCL init timed out after " + std::to_string(timeout.count()) +
                        " ms and was aborted: ";
  if (absent > 0) {
    message += std::to_string(absent) + " ranks never called NCCL's init: " + missing;
  } else {
    message +=
        "every rank called NCCL's init but the communicator did not connect (check that the "
        "nodes reach each other, NCCL_SOCKET_IFNAME; NCCL_DEBUG=INFO shows NCCL's view)";
  }
  throw InitError(message);
}

void NcclCommunicator::enqueued(ncclResult_t status, const std::string& what) {
  const bool waited = status == ncclInProgress;
  if (waited) status = settle(state_->comm, NcclClock::now() + timeout_, state_.get());
  if (status == ncclSuccess) return;
  // An abort from another thread (the watchdog, Context::abort) waits for this call: stop
  // waiting and report it; the aborting thread aborts once this call released the mutex.
  state_->throw_if_aborted(what + where(rank_));
  const std::string detail = last_error(state_->comm);
  if (status == ncclInProgress) {
    const std::string reason =
        what + " was not enqueued within " + std::to_string(timeout_.count()) + " ms";
    state_->abort_locked(reason);
    throw CommError(reason + where(rank_));
  }
  const std::string reason = what + ": NCCL error: " + ncclGetErrorString(status) + detail;
  // An error found while waiting is the communicator's own (asynchronous) state: it is
  // unusable now, so abort it and let every later call fail with this reason. An error
  // returned at once (an invalid argument) leaves it intact.
  if (waited) state_->abort_locked(reason);
  throw CommError(reason + where(rank_));
}

void NcclCommunicator::check_call(const CallDescriptor& call) {
  // Every rank has read check n - 2 by now (it wrote its key of check n - 1 after reading
  // n - 2, and this rank saw all keys of n - 1): drop this rank's key of n - 2, so that
  // MismatchCheck::Always does not grow the store without bound.
  if (checks_ >= 2) {
    store_->delete_key("call/" + std::to_string(checks_ - 2) + "/" + std::to_string(rank_));
  }
  const std::string prefix = "call/" + std::to_string(checks_++) + "/";
  const auto wire = call.encode();
  store_->set(prefix + std::to_string(rank_),
              std::string_view(reinterpret_cast<const char*>(wire.data()), sizeof wire));
  std::vector<std::string> keys;
  for (int r = 0; r < world_size_; ++r) keys.push_back(prefix + std::to_string(r));
  std::vector<CallDescriptor> views;
  for (const auto& value : store_->multi_get(keys)) {
    CallDescriptor::Wire w{};
    std::memcpy(w.data(), value.data(), std::min(value.size(), sizeof w));
    views.push_back(CallDescriptor::decode(w));
  }
  check_same_call(views, rank_);
}

template <typename Enqueue>
Work NcclCommunicator::launch(const CallDescriptor& call, void* after,
                              std::optional<std::size_t> bucket, Enqueue&& enqueue) {
  const std::string what = call.str() + " #" + std::to_string(++sequence_) + where(rank_);
  state_->throw_if_aborted(what);  // at once, even while an abort is under way
  // Recorded as queued here, started once handed to the stream, finished by NcclWork::finish.
  const std::uint64_t seq =
      recorder_ ? recorder_->on_queued(call, bucket.value_or(record::kNoBucket)) : 0;
  RecordFailureGuard record_failure(seq != 0 ? recorder_.get() : nullptr, seq);
  if (policy_.next()) check_call(call);
  // No lock here: the CUDA calls below (and the copies in `enqueue`) can block behind a
  // stuck kernel when the stream's launch queue is full, and an abort, which ends that
  // kernel, must never wait for them. Only the NCCL calls take state_->mutex (nccl_call).
  state_->throw_if_aborted(what);
  // The calling thread may not have made this communicator's device current.
  cuda_check(cudaSetDevice(device_), what);
  cuda_check(cudaEventRecord(ready_.get(), static_cast<cudaStream_t>(after)), what);
  cuda_check(cudaStreamWaitEvent(stream_, ready_.get(), 0), what);
  CudaEventPool::Event done = events_->acquire(what);  // before anything is queued
  enqueue();
  if (seq != 0) recorder_->on_started(seq);
  try {
    cuda_check(cudaEventRecord(done.get(), stream_), what);
  } catch (const CommError& e) {
    // The collective is queued but cannot be watched: nothing can tell when its buffers
    // are free again, so the communicator cannot be used any further.
    state_->abort(e.what());
    throw;
  }
  last_ = std::make_shared<NcclWork>(what, std::move(done), timeout_, state_);
  if (seq != 0) last_->record_as(recorder_, seq);
  record_failure.dismiss();
  state_->watch(last_);  // fails it at once when an abort began meanwhile
  return Work(last_);
}

template <typename Call>
void NcclCommunicator::nccl_call(const std::string& what, Call&& call) {
  // No abort while NCCL enqueues (and none of its waiting, which an abort cuts short).
  state_->with_comm(what + where(rank_), [&](ncclComm_t comm) { enqueued(call(comm), what); });
}

void* NcclCommunicator::staging(std::size_t bytes, std::size_t slot) {
  if (staging_bytes_[slot] < bytes) {
    staging_[slot] = allocate(bytes);
    staging_bytes_[slot] = bytes;
  }
  return staging_[slot].get();
}

void* NcclCommunicator::pinned(std::size_t bytes, std::size_t slot) {
  if (pinned_bytes_[slot] < bytes) {
    // The new buffer first: when cudaMallocHost fails, the old one and its size stay valid.
    void* p = nullptr;
    cuda_check(cudaMallocHost(&p, std::max<std::size_t>(bytes, 1)),
               "allocating " + std::to_string(bytes) + " bytes of pinned host memory");
    pinned_[slot] = std::shared_ptr<void>(p, [](void* q) { cudaFreeHost(q); });
    pinned_bytes_[slot] = bytes;
  }
  return pinned_[slot].get();
}

Work NcclCommunicator::allreduce(void* data, std::size_t count, DType dtype, ReduceOp op,
                                 const CollectiveOptions& options) {
  if (options.wire_dtype && *options.wire_dtype != dtype) {
    return allreduce_compressed(data, count, op, *options.wire_dtype, options);
  }
  CallDescriptor call{CallKind::Allreduce, dtype, count, static_cast<std::int64_t>(op)};
  const std::size_t bytes = count * size_of(dtype);
  if (is_device_memory(data)) {
    return launch(call, options.after_stream, options.bucket, [&] {
      if (count == 0) return;
      nccl_call(call.str(), [&](ncclComm_t comm) {
        return ncclAllReduce(data, data, count, nccl_type(dtype), nccl_op(op), comm, stream_);
      });
    });
  }
  state_->throw_if_aborted(call.str() + where(rank_));  // before allocating staging memory
  void* device = staging(bytes, 0);
  void* host = pinned(bytes, 0);
  if (bytes != 0) std::memcpy(host, data, bytes);
  Work work = launch(call, options.after_stream, options.bucket, [&] {
    if (count == 0) return;
    cuda_check(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, stream_), call.str());
    nccl_call(call.str(), [&](ncclComm_t comm) {
      return ncclAllReduce(device, device, count, nccl_type(dtype), nccl_op(op), comm, stream_);
    });
    cuda_check(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream_), call.str());
  });
  work.wait(timeout_);  // host memory: complete before returning, as the caller may reuse it
  if (bytes != 0) std::memcpy(data, host, bytes);
  return work;
}

#if defined(DDP_HAVE_CUDA_KERNELS)
Work NcclCommunicator::allreduce_compressed(void* data, std::size_t count, ReduceOp op, DType wire,
                                            const CollectiveOptions& options) {
  if (wire != DType::F16 && wire != DType::BF16) {
    throw Unsupported(std::string("allreduce of f32 through ") + to_string(wire) +
                      ": only f16 or bf16" + where(rank_));
  }
  if (!is_device_memory(data)) {
    throw Unsupported(std::string("allreduce through ") + to_string(wire) +
                      ": compression on NCCL needs device memory" + where(rank_));
  }
  CallDescriptor call{CallKind::Allreduce, wire, count, static_cast<std::int64_t>(op)};
  const WireType type = wire == DType::F16 ? WireType::F16 : WireType::BF16;
  const float scale = op == ReduceOp::Avg ? 1.0f / static_cast<float>(world_size_) : 1.0f;
  // Min and max commute with the narrowing; sum and the pre-divided average are sums.
  const ncclRedOp_t reduce = op == ReduceOp::Avg ? ncclSum : nccl_op(op);
  auto* values = static_cast<float*>(data);
  return launch(call, options.after_stream, options.bucket, [&] {
    if (count == 0) return;
    void* buffer = wire_buffer(count * size_of(wire));
    cuda_check(narrow_on_stream(values, buffer, count, type, scale, stream_),
               call.str() + ": narrowing f32 to " + to_string(wire));
    nccl_call(call.str(), [&](ncclComm_t comm) {
      return ncclAllReduce(buffer, buffer, count, nccl_type(wire), reduce, comm, stream_);
    });
    cuda_check(widen_on_stream(buffer, values, count, type, 1.0f, stream_),
               call.str() + ": widening " + to_string(wire) + " to f32");
  });
}

void* NcclCommunicator::wire_buffer(std::size_t bytes) {
  if (wire_bytes_ >= bytes) return wire_;
  if (wire_ != nullptr) cuda_check(cudaFreeAsync(wire_, stream_), "freeing the wire buffer");
  wire_ = nullptr;
  wire_bytes_ = 0;
  cuda_check(cudaMallocAsync(&wire_, bytes, stream_), "allocating a " + std::to_string(bytes) +
                                                          "-byte wire buffer on device " +
                                                          std::to_string(device_));
  wire_bytes_ = bytes;
  return wire_;
}
#else
Work NcclCommunicator::allreduce_compressed(void*, std::size_t, ReduceOp, DType wire,
                                            const CollectiveOptions&) {
  throw Unsupported("allreduce through " + std::string(to_string(wire)) +
                    ": libddp was built without nvcc, so NCCL has no compression kernels" +
                    where(rank_));
}

void* NcclCommunicator::wire_buffer(std::size_t) { return nullptr; }
#endif

Work NcclCommunicator::broadcast(void* data, std::size_t count, DType dtype, int root,
                                 const CollectiveOptions& options) {
  if (root < 0 || root >= world_size_) {
    throw CommError("broadcast root " + std::to_string(root) + " is not a rank" + where(rank_));
  }
  CallDescriptor call{CallKind::Broadcast, dtype, count, root};
  const std::size_t bytes = count * size_of(dtype);
  const bool on_device = is_device_memory(data);
  state_->throw_if_aborted(call.str() + where(rank_));  // before allocating staging memory
  void* buffer = on_device ? data : staging(bytes, 0);
  void* host = on_device ? nullptr : pinned(bytes, 0);
  if (!on_device && bytes != 0) std::memcpy(host, data, bytes);
  Work work = launch(call, options.after_stream, [&] {
    if (count == 0) return;
    if (!on_device) {
      cuda_check(cudaMemcpyAsync(buffer, host, bytes, cudaMemcpyHostToDevice, stream_), call.str());
    }
    nccl_call(call.str(), [&](ncclComm_t comm) {
      return ncclBroadcast(buffer, buffer, count, nccl_type(dtype), root, comm, stream_);
    });
    if (!on_device) {
      cuda_check(cudaMemcpyAsync(host, buffer, bytes, cudaMemcpyDeviceToHost, stream_), call.str());
    }
  });
  if (!on_device) {
    work.wait(timeout_);
    if (bytes != 0) std::memcpy(data, host, bytes);
  }
  return work;
}

Work NcclCommunicator::allgather(const void* in, void* out, std::size_t count, DType dtype,
                                 const CollectiveOptions& options) {
  CallDescriptor call{CallKind::Allgather, dtype, count, 0};
  const std::size_t bytes = count * size_of(dtype);
  return staged(call, options.after_stream, in, bytes, out, bytes * world_size_,
                [&](const void* src, void* dst) {
                  nccl_call(call.str(), [&](ncclComm_t comm) {
                    return ncclAllGather(src, dst, count, nccl_type(dtype), comm, stream_);
                  });
                });
}

Work NcclCommunicator::reduce_scatter(const void* in, void* out, std::size_t count, DType dtype,
                                      ReduceOp op, const CollectiveOptions& options) {
  CallDescriptor call{CallKind::ReduceScatter, dtype, count, static_cast<std::int64_t>(op)};
  const std::size_t bytes = count * size_of(dtype);
  return staged(call, options.after_stream, in, bytes * world_size_, out, bytes,
                [&](const void* src, void* dst) {
                  nccl_call(call.str(), [&](ncclComm_t comm) {
                    return ncclReduceScatter(src, dst, count, nccl_type(dtype), nccl_op(op), comm,
                                             stream_);
                  });
                });
}

// Out of place: device buffers are used as they are; host ones go through pinned memory
// and device staging, and then the call completes before it returns.
template <typename Collective>
Work NcclCommunicator::staged(const CallDescriptor& call, void* after, const void* in,
                              std::size_t in_bytes, void* out, std::size_t out_bytes,
                              Collective&& collective) {
  const bool in_device = is_device_memory(in);
  const bool out_device = is_device_memory(out);
  const bool on_device = in_device && out_device;
  state_->throw_if_aborted(call.str() + where(rank_));  // before allocating staging memory
  const void* src = on_device ? in : staging(in_bytes, 0);
  void* dst = on_device ? out : staging(out_bytes, 1);
  const void* host_in = in;
  if (!in_device) {
    void* p = pinned(in_bytes, 0);
    if (in_bytes != 0) std::memcpy(p, in, in_bytes);
    host_in = p;
  }
  void* host_out = out_device ? out : pinned(out_bytes, 1);
  Work work = launch(call, after, [&] {
    if (in_bytes == 0 || out_bytes == 0) return;
    if (!on_device) {
      cuda_check(
          cudaMemcpyAsync(const_cast<void*>(src), host_in, in_bytes, cudaMemcpyDefault, stream_),
          call.str());
    }
    collective(src, dst);
    if (!on_device) {
      cuda_check(cudaMemcpyAsync(host_out, dst, out_bytes, cudaMemcpyDefault, stream_), call.str());
    }
  });
  if (!on_device) {
    work.wait(timeout_);
    if (!out_device && out_bytes != 0) std::memcpy(out, host_out, out_bytes);
  }
  return work;
}

Work NcclCommunicator::barrier() {
  // A one-element all-reduce, waited for on the host.
  state_->throw_if_aborted("barrier()" + where(rank_));  // before allocating its scratch
  void* scratch = staging(sizeof(float), 1);
  Work work = launch(CallDescriptor{}, nullptr, [&] {
    nccl_call("barrier", [&](ncclComm_t comm) {
      return ncclAllReduce(scratch, scratch, 1, ncclFloat32, ncclSum, comm, stream_);
    });
  });
  work.wait(timeout_);
  return work;
}

std::shared_ptr<void> NcclCommunicator::allocate(std::size_t bytes) {
  void* p = nullptr;
  cuda_check(cudaSetDevice(device_), "selecting CUDA device " + std::to_string(device_));
  cuda_check(cudaMalloc(&p, std::max<std::size_t>(bytes, 1)),
             "allocating " + std::to_string(bytes) + " bytes on device " + std::to_string(device_));
  std::shared_ptr<void> owned(p, [](void* q) { cudaFree(q); });
  cuda_check(cudaMemset(p, 0, bytes), "zeroing device memory");
  // cudaMemset is queued on the legacy default stream, which the non-blocking streams the
  // buffer is used on do not wait for: finish it before the buffer is handed out.
  cuda_check(cudaStreamSynchronize(nullptr), "zeroing device memory");
  return owned;
}

void NcclCommunicator::fill_zero(void* data, std::size_t bytes, void* stream) {
  cuda_check(cudaMemsetAsync(data, 0, bytes, static_cast<cudaStream_t>(stream)),
             "zeroing gradients");
}

}  // namespace ddp::detail
