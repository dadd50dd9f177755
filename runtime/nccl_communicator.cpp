#include "nccl_communicator.hpp"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>

#include "backends.hpp"
#include "promise_work.hpp"

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

bool is_device_memory(const void* p) {
  if (p == nullptr) return true;  // count 0: nothing is touched
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, p) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "invalid value" of unregistered memory
    return false;
  }
  return attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
}

// A collective queued on the communication stream: an event for stream ordering, and a host
// callback after it that completes the promise (so a host wait has a timeout).
class NcclWork : public WorkState {
 public:
  NcclWork(std::string description, cudaEvent_t done, std::shared_ptr<NcclCommState> state)
      : promise_(std::make_shared<PromiseWork>(std::move(description))),
        done_(done),
        state_(std::move(state)) {}
  ~NcclWork() override { cudaEventDestroy(done_); }

  std::shared_ptr<PromiseWork> promise() const { return promise_; }
  bool wait_for(std::chrono::milliseconds timeout) override {
    if (promise_->wait_for(timeout)) return true;
    state_->abort(describe() + " did not complete within " + std::to_string(timeout.count()) +
                  " ms");
    return false;
  }
  bool done() override { return promise_->done(); }
  void wait_on_stream(void* stream, std::chrono::milliseconds) override {
    cuda_check(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), done_, 0),
               "ordering a stream after " + describe());
  }
  std::string describe() const override { return promise_->describe(); }

 private:
  std::shared_ptr<PromiseWork> promise_;
  cudaEvent_t done_;
  std::shared_ptr<NcclCommState> state_;
};

// cudaLaunchHostFunc's callback: completes the promise it owns a reference to.
void CUDART_CB complete_promise(void* data) {
  std::unique_ptr<std::shared_ptr<PromiseWork>> promise(
      static_cast<std::shared_ptr<PromiseWork>*>(data));
  (*promise)->complete();
}

}  // namespace

void NcclCommState::abort(const std::string& reason) {
  std::lock_guard lock(mutex);
  if (comm == nullptr || !aborted_because.empty()) return;
  ncclCommAbort(comm);
  aborted_because = reason;
}

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
  try {
    int count = 0;
    cuda_check(cudaGetDeviceCount(&count), "counting CUDA devices");
    if (count == 0) throw InitError(me + ": the NCCL backend needs a CUDA device; none found");
    device_ = options.cuda_device >= 0 ? options.cuda_device : env.local_rank % count;
    cuda_check(cudaSetDevice(device_), "selecting CUDA device " + std::to_string(device_));
    cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "creating a stream");
    wait_for_all_ranks(options.init_timeout);
    init_communicator(options);
    std::lock_guard lock(state_->mutex);
    state_->comm = comm_;
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
  // operation on the host, with a timeout, instead of an unbounded cudaStreamSynchronize.
  bool aborted = false;
  {
    std::lock_guard lock(state_->mutex);
    aborted = !state_->aborted_because.empty();
  }
  bool drained = true;
  if (last_ && !aborted) {
    try {
      drained = last_->wait_for(timeout_);
    } catch (...) {
      drained = true;  // it finished (with an error): the stream has passed it
    }
  }
  if (comm_ != nullptr || stream_ != nullptr) cudaSetDevice(device_);
  if (comm_ != nullptr) {
    std::lock_guard lock(state_->mutex);
    // Abort stops kernels that wait for a lost peer; destroy would wait for them. An
    // aborted communicator is already freed.
    if (!state_->aborted_because.empty()) {
      drained = false;
    } else if (drained) {
      ncclCommDestroy(comm_);
    } else {
      ncclCommAbort(comm_);
    }
    state_->comm = nullptr;
    comm_ = nullptr;
  }
  if (stream_ != nullptr) {
    if (drained) cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);  // with work still queued: released once it completes
    stream_ = nullptr;
  }
  last_.reset();
}

// Every rank announces itself, then waits for all others: a rank that never comes is named
// instead of leaving ncclCommInitRank hanging.
void NcclCommunicator::wait_for_all_ranks(std::chrono::milliseconds timeout) {
  store_->set("arrived/" + std::to_string(rank_), "1");
  std::vector<std::string> keys;
  for (int r = 0; r < world_size_; ++r) keys.push_back("arrived/" + std::to_string(r));
  try {
    store_->wait(keys, timeout);
  } catch (const store::StoreTimeout&) {
    std::string missing;
    int shown = 0, absent = 0;
    for (int r = 0; r < world_size_; ++r) {
      if (store_->check({keys[r]})) continue;
      ++absent;
      if (shown++ < 16) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    }
    if (absent > 16) missing += " (and " + std::to_string(absent - 16) + " more)";
    throw InitError("rank " + std::to_string(rank_) + ": NCCL init timed out after " +
                    std::to_string(timeout.count()) + " ms: " + std::to_string(absent) +
                    " ranks never arrived: " + missing);
  }
}

void NcclCommunicator::init_communicator(const InitOptions& options) {
  if (world_size_ <= options.nccl_scalable_threshold) {
    ncclUniqueId id{};
    if (rank_ == 0) {
      nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
      store_->set("unique_id", std::string_view(id.internal, sizeof id.internal));
    }
    const std::string bytes = store_->get("unique_id");
    std::memcpy(id.internal, bytes.data(), std::min(bytes.size(), sizeof id.internal));
    nccl_check(ncclCommInitRank(&comm_, world_size_, id, rank_), "ncclCommInitRank");
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
  const auto values = store_->multi_get(keys);
  std::vector<ncclUniqueId> ids(roots);
  for (int i = 0; i < roots; ++i) {
    std::memcpy(ids[i].internal, values[i].data(),
                std::min(values[i].size(), sizeof ids[i].internal));
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  nccl_check(ncclCommInitRankScalable(&comm_, world_size_, rank_, roots, ids.data(), &config),
             "ncclCommInitRankScalable with " + std::to_string(roots) + " roots");
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
Work NcclCommunicator::launch(const CallDescriptor& call, void* after, Enqueue&& enqueue) {
  if (policy_.next()) check_call(call);
  const std::string what = call.str() + where(rank_);
  std::lock_guard lock(state_->mutex);  // no abort while this call enqueues
  if (!state_->aborted_because.empty()) {
    throw CommError(what + ": the communicator was aborted after " + state_->aborted_because);
  }
  // The calling thread may not have made this communicator's device current.
  cuda_check(cudaSetDevice(device_), what);
  cudaEvent_t ready = nullptr;
  cuda_check(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), what);
  cuda_check(cudaEventRecord(ready, static_cast<cudaStream_t>(after)), what);
  cuda_check(cudaStreamWaitEvent(stream_, ready, 0), what);
  cudaEventDestroy(ready);  // released once the stream has passed it
  enqueue();
  cudaEvent_t done = nullptr;
  cuda_check(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), what);
  auto work = std::make_shared<NcclWork>(what, done, state_);
  cuda_check(cudaEventRecord(done, stream_), what);
  auto holder = std::make_unique<std::shared_ptr<PromiseWork>>(work->promise());
  cuda_check(cudaLaunchHostFunc(stream_, complete_promise, holder.get()), what);
  holder.release();  // owned by the callback now
  last_ = work->promise();
  return Work(work);
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
    pinned_[slot].reset();
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
  CallDescriptor call{CallKind::Allreduce, dtype, count, static_cast<std::int64_t>(op)};
  if (options.wire_dtype && *options.wire_dtype != dtype) {
    throw Unsupported("allreduce through " + std::string(to_string(*options.wire_dtype)) +
                      ": compression is not available on NCCL yet" + where(rank_));
  }
  const std::size_t bytes = count * size_of(dtype);
  if (is_device_memory(data)) {
    return launch(call, options.after_stream, [&] {
      if (count == 0) return;
      nccl_check(ncclAllReduce(data, data, count, nccl_type(dtype), nccl_op(op), comm_, stream_),
                 call.str());
    });
  }
  void* device = staging(bytes, 0);
  void* host = pinned(bytes, 0);
  if (bytes != 0) std::memcpy(host, data, bytes);
  Work work = launch(call, options.after_stream, [&] {
    if (count == 0) return;
    cuda_check(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, stream_), call.str());
    nccl_check(ncclAllReduce(device, device, count, nccl_type(dtype), nccl_op(op), comm_, stream_),
               call.str());
    cuda_check(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream_), call.str());
  });
  work.wait(timeout_);  // host memory: complete before returning, as the caller may reuse it
  if (bytes != 0) std::memcpy(data, host, bytes);
  return work;
}

Work NcclCommunicator::broadcast(void* data, std::size_t count, DType dtype, int root,
                                 const CollectiveOptions& options) {
  if (root < 0 || root >= world_size_) {
    throw CommError("broadcast root " + std::to_string(root) + " is not a rank" + where(rank_));
  }
  CallDescriptor call{CallKind::Broadcast, dtype, count, root};
  const std::size_t bytes = count * size_of(dtype);
  const bool on_device = is_device_memory(data);
  void* buffer = on_device ? data : staging(bytes, 0);
  void* host = on_device ? nullptr : pinned(bytes, 0);
  if (!on_device && bytes != 0) std::memcpy(host, data, bytes);
  Work work = launch(call, options.after_stream, [&] {
    if (count == 0) return;
    if (!on_device) {
      cuda_check(cudaMemcpyAsync(buffer, host, bytes, cudaMemcpyHostToDevice, stream_), call.str());
    }
    nccl_check(ncclBroadcast(buffer, buffer, count, nccl_type(dtype), root, comm_, stream_),
               call.str());
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
                  nccl_check(ncclAllGather(src, dst, count, nccl_type(dtype), comm_, stream_),
                             call.str());
                });
}

Work NcclCommunicator::reduce_scatter(const void* in, void* out, std::size_t count, DType dtype,
                                      ReduceOp op, const CollectiveOptions& options) {
  CallDescriptor call{CallKind::ReduceScatter, dtype, count, static_cast<std::int64_t>(op)};
  const std::size_t bytes = count * size_of(dtype);
  return staged(call, options.after_stream, in, bytes * world_size_, out, bytes,
                [&](const void* src, void* dst) {
                  nccl_check(ncclReduceScatter(src, dst, count, nccl_type(dtype), nccl_op(op),
                                               comm_, stream_),
                             call.str());
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
  void* scratch = staging(sizeof(float), 1);
  Work work = launch(CallDescriptor{}, nullptr, [&] {
    nccl_check(ncclAllReduce(scratch, scratch, 1, ncclFloat32, ncclSum, comm_, stream_), "barrier");
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
  return owned;
}

void NcclCommunicator::fill_zero(void* data, std::size_t bytes, void* stream) {
  cuda_check(cudaMemsetAsync(data, 0, bytes, static_cast<cudaStream_t>(stream)),
             "zeroing gradients");
}

}  // namespace ddp::detail
