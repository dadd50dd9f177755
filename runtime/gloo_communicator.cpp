#include "gloo_communicator.hpp"

#include <fcntl.h>
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <vector>

#include "collective_recorder.hpp"
#include "gloo_store_adapter.hpp"
#include "reduce_kernels.hpp"

namespace ddp::detail {

namespace {

// Calls f with a value of the C++ type of dtype.
template <typename F>
void dispatch(DType dtype, F&& f) {
  switch (dtype) {
    case DType::F32:
      return f(float{});
    case DType::F64:
      return f(double{});
    case DType::I32:
      return f(std::int32_t{});
    case DType::I64:
      return f(std::int64_t{});
    case DType::F16:
      return f(float16{});
    case DType::BF16:
      return f(bfloat16{});
  }
}

std::string where(int rank) { return " (rank " + std::to_string(rank) + ", gloo)"; }

sigset_t sigpipe_set() {
  sigset_t pipe;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  return pipe;
}

void block_sigpipe_in_this_thread() {
  const sigset_t pipe = sigpipe_set();
  pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
}

// Blocks SIGPIPE in the calling thread while it lives; threads started meanwhile keep it
// blocked. A SIGPIPE that a write of this thread raised meanwhile is taken back (unless the
// thread had SIGPIPE blocked already: then a pending one may be its own).
class SigpipeBlocked {
 public:
  SigpipeBlocked() {
    const sigset_t pipe = sigpipe_set();
    pthread_sigmask(SIG_BLOCK, &pipe, &before_);
  }
  ~SigpipeBlocked() {
    if (!sigismember(&before_, SIGPIPE)) {
      const sigset_t pipe = sigpipe_set();
      sigset_t pending;
      const timespec now{};
      if (sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE)) {
        sigtimedwait(&pipe, nullptr, &now);
      }
    }
    pthread_sigmask(SIG_SETMASK, &before_, nullptr);
  }
  SigpipeBlocked(const SigpipeBlocked&) = delete;
  SigpipeBlocked& operator=(const SigpipeBlocked&) = delete;

 private:
  sigset_t before_{};
};

// A TCP endpoint (family, address, port) from the front of a Gloo address's bytes, which
// begin with a sockaddr_storage; nullopt when they do not hold one.
std::optional<sockaddr_storage> endpoint_in(const char* bytes, std::size_t size) {
  sockaddr_storage ss{};
  if (size < sizeof ss) return std::nullopt;
  std::memcpy(&ss, bytes, sizeof ss);
  if (ss.ss_family != AF_INET && ss.ss_family != AF_INET6) return std::nullopt;
  return ss;
}

bool same_endpoint(const sockaddr_storage& a, const sockaddr_storage& b) {
  if (a.ss_family != b.ss_family) return false;
  if (a.ss_family == AF_INET) {
    const auto& x = reinterpret_cast<const sockaddr_in&>(a);
    const auto& y = reinterpret_cast<const sockaddr_in&>(b);
    return x.sin_port == y.sin_port && x.sin_addr.s_addr == y.sin_addr.s_addr;
  }
  const auto& x = reinterpret_cast<const sockaddr_in6&>(a);
  const auto& y = reinterpret_cast<const sockaddr_in6&>(b);
  return x.sin6_port == y.sin6_port &&
         std::memcmp(&x.sin6_addr, &y.sin6_addr, sizeof x.sin6_addr) == 0;
}

bool any_of(const std::vector<sockaddr_storage>& endpoints, const sockaddr_storage& e) {
  return std::any_of(endpoints.begin(), endpoints.end(),
                     [&](const sockaddr_storage& x) { return same_endpoint(x, e); });
}

// Shuts down (without closing) every socket of this process that is a connection of the mesh:
// one whose own end is one of this rank's pair addresses (it accepted the connection) or whose
// other end is a peer's pair address for this rank (it connected). Gloo's device thread then
// reads end-of-file and fails every operation waiting on the pair, and so does the peer's
// side. Each descriptor is checked through a duplicate, so a descriptor closed and reused
// meanwhile is never touched; the descriptors stay Gloo's to close.
void shut_down_mesh(const std::vector<sockaddr_storage>& own,
                    const std::vector<sockaddr_storage>& peers) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    const auto target = std::filesystem::read_symlink(entry.path(), ec);
    if (ec || !target.native().starts_with("socket:")) continue;
    int fd = -1;
    try {
      fd = std::stoi(entry.path().filename().native());
    } catch (const std::exception&) {
      continue;
    }
    const int copy = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (copy < 0) continue;
    sockaddr_storage mine{}, theirs{};
    socklen_t mine_size = sizeof mine, theirs_size = sizeof theirs;
    const bool is_mesh =
        (::getsockname(copy, reinterpret_cast<sockaddr*>(&mine), &mine_size) == 0 &&
         any_of(own, mine)) ||
        (::getpeername(copy, reinterpret_cast<sockaddr*>(&theirs), &theirs_size) == 0 &&
         any_of(peers, theirs));
    if (is_mesh) ::shutdown(copy, SHUT_RDWR);
    ::close(copy);
  }
}

}  // namespace

GlooCommunicator::GlooCommunicator(store::Store& store, int rank, int world_size,
                                   const GlooOptions& options)
    : rank_(rank),
      world_size_(world_size),
      timeout_(options.timeout),
      policy_(options.mismatch_check) {
  // Gloo writes to its sockets with writev(2), which raises SIGPIPE when the peer is gone (or
  // this rank's abort shut the socket down). The threads that write (the communication
  // thread, and Gloo's device thread, started below with the creating thread's mask) keep it
  // blocked: the write fails with EPIPE, the collective with a CommError, and the program
  // never sees a signal it did not ask for.
  queue_.submit([] { block_sigpipe_in_this_thread(); });
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.hostname;
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, world_size);
    context->setTimeout(options.connect_timeout);
    GlooStoreAdapter adapter(store, options.connect_timeout);
    {
      SigpipeBlocked blocked;
      auto device = gloo::transport::tcp::CreateDevice(attr);
      context->connectFullMesh(adapter, device);
    }
    note_mesh_endpoints(*context, adapter);
    context->setTimeout(options.timeout);
    context_ = std::move(context);
    if (options.shared_memory && world_size > 1) {
      shm_ = ShmAllreduce::create(store, rank, world_size, options.timeout);
    }
  } catch (const std::exception& e) {
    throw InitError("rank " + std::to_string(rank) + " of " + std::to_string(world_size) +
                    ": could not build the gloo mesh on address '" +
                    (options.hostname.empty() ? "<host name>" : options.hostname) +
                    "': " + e.what());
  }
}

GlooCommunicator::~GlooCommunicator() = default;

void GlooCommunicator::note_mesh_endpoints(gloo::Context& context,
                                           const GlooStoreAdapter& adapter) {
  for (int peer = 0; peer < world_size_; ++peer) {
    if (peer == rank_) continue;
    // This side's address for the pair with `peer`.
    const auto own = context.getPair(peer)->address().bytes();
    if (auto e = endpoint_in(own.data(), own.size())) own_endpoints_.push_back(*e);
    // The peer's address for its pair with this rank: its key holds one address per other
    // rank, in rank order.
    const auto found = adapter.got().find(std::to_string(peer));
    if (found == adapter.got().end()) continue;
    const auto& all = found->second;
    const std::size_t each = all.size() / static_cast<std::size_t>(world_size_ - 1);
    const auto index = static_cast<std::size_t>(rank_ < peer ? rank_ : rank_ - 1);
    if (each == 0 || (index + 1) * each > all.size()) continue;
    if (auto e = endpoint_in(all.data() + index * each, each)) peer_endpoints_.push_back(*e);
  }
}

Work GlooCommunicator::enqueue(const CallDescriptor& call, std::function<void()> body,
                               std::optional<std::size_t> bucket) {
  const std::string what = call.str() + where(rank_);
  auto work = std::make_shared<PromiseWork>(what);
  const bool check = policy_.next();
  std::lock_guard lock(abort_mutex_);
  if (!abort_reason_.empty()) {
    throw CommError(what + ": the gloo communicator was aborted: " + abort_reason_);
  }
  const std::uint64_t seq =
      recorder_ ? recorder_->on_queued(call, bucket.value_or(record::kNoBucket)) : 0;
  queued_.emplace_back(work, seq);
  auto task = [this, work, what, call, check, seq, body = std::move(body)] {
    {
      std::lock_guard started(abort_mutex_);
      if (!abort_reason_.empty()) return;  // abort() failed this work already
      queued_.pop_front();                 // this work: tasks start in the order they were queued
    }
    if (seq != 0) recorder_->on_started(seq);
    std::exception_ptr result;
    try {
      if (first_failure_) std::rethrow_exception(first_failure_);
      try {
        if (check) check_call(call);
        body();
      } catch (const Error&) {
        first_failure_ = std::current_exception();
        throw;
      } catch (const std::exception& e) {
        first_failure_ = std::make_exception_ptr(CommError(what + ": " + e.what()));
        std::rethrow_exception(first_failure_);
      }
    } catch (...) {
      result = std::current_exception();
    }
    {
      // Aborted while it ran: its outcome is not to be trusted (it may have ended early
      // because the abort came from a peer's failure), so it fails with the reason too.
      std::lock_guard ended(abort_mutex_);
      if (!abort_reason_.empty()) {
        result = std::make_exception_ptr(
            CommError(what + ": the gloo communicator was aborted: " + abort_reason_));
      }
    }
    if (seq != 0) recorder_->on_finished(seq, result != nullptr);  // before a waiter wakes
    work->complete(result);
  };
  try {
    queue_.submit(std::move(task));
  } catch (...) {
    queued_.pop_back();  // never queued: keep queued_ in step with the tasks
    if (seq != 0) recorder_->on_finished(seq, true);
    throw;
  }
  return Work(work);
}

void GlooCommunicator::abort(const std::string& reason) {
  std::deque<std::pair<std::shared_ptr<PromiseWork>, std::uint64_t>> queued;
  std::string because;
  {
    std::lock_guard lock(abort_mutex_);
    if (!abort_reason_.empty()) return;
    abort_reason_ = reason.empty() ? "aborted (no reason given)" : reason;
    aborted_.store(true);
    because = abort_reason_;
    queued.swap(queued_);
  }
  for (auto& [work, seq] : queued) {
    // Their tasks never run now: the record finishes here, failed, before a waiter wakes.
    if (seq != 0) recorder_->on_finished(seq, true);
    work->complete(std::make_exception_ptr(
        CommError(work->describe() + ": the gloo communicator was aborted: " + because)));
  }
  // The collective running now, if any, ends at once too.
  if (shm_) shm_->interrupt();
  shut_down_mesh(own_endpoints_, peer_endpoints_);
}

void GlooCommunicator::check_call(const CallDescriptor& call) {
  const auto mine = call.encode();
  std::vector<CallDescriptor::Wire> all(world_size_);
  gloo::AllgatherOptions options(context_);
  options.setInput(const_cast<std::int64_t*>(mine.data()), mine.size());
  options.setOutput(all.data()->data(), mine.size() * world_size_);
  options.setTag(next_tag());
  gloo::allgather(options);
  std::vector<CallDescriptor> views;
  for (const auto& wire : all) views.push_back(CallDescriptor::decode(wire));
  check_same_call(views, rank_);
}

void GlooCommunicator::run_allreduce(void* data, std::size_t count, DType dtype, ReduceOp op) {
  if (count == 0 || world_size_ == 1) return;
  if (shm_) return shm_->allreduce(data, count, dtype, op);
  dispatch(dtype, [&](auto tag_value) {
    using T = decltype(tag_value);
    gloo::AllreduceOptions options(context_);
    options.setOutput(static_cast<T*>(data), count);
    options.setReduceFunction(reduce_function(dtype, op));
    options.setTag(next_tag());
    gloo::allreduce(options);
  });
  if (op == ReduceOp::Avg) divide(data, count, dtype, world_size_);
}

void GlooCommunicator::run_compressed_allreduce(float* data, std::size_t count, DType wire,
                                                ReduceOp op) {
  // Kept between calls: a fresh buffer per bucket would page-fault its way in every step.
  if (wire_scratch_.size() < count) wire_scratch_.resize(count);
  narrow(data, wire_scratch_.data(), count, wire);
  run_allreduce(wire_scratch_.data(), count, wire, op);
  widen(wire_scratch_.data(), data, count, wire);
}

Work GlooCommunicator::allreduce(void* data, std::size_t count, DType dtype, ReduceOp op,
                                 const CollectiveOptions& options) {
  if (options.wire_dtype && *options.wire_dtype != dtype) {
    const DType wire = *options.wire_dtype;
    if (dtype != DType::F32 || (wire != DType::F16 && wire != DType::BF16)) {
      throw Unsupported(std::string("allreduce of ") + to_string(dtype) + " through " +
                        to_string(wire) + ": only f32 through f16 or bf16" + where(rank_));
    }
    CallDescriptor call{CallKind::Allreduce, wire, count, static_cast<std::int64_t>(op)};
    return enqueue(
        call, [=, this] { run_compressed_allreduce(static_cast<float*>(data), count, wire, op); },
        options.bucket);
  }
  CallDescriptor call{CallKind::Allreduce, dtype, count, static_cast<std::int64_t>(op)};
  return enqueue(
      call, [=, this] { run_allreduce(data, count, dtype, op); }, options.bucket);
}

Work GlooCommunicator::broadcast(void* data, std::size_t count, DType dtype, int root,
                                 const CollectiveOptions&) {
  if (root < 0 || root >= world_size_) {
    throw CommError("broadcast root " + std::to_string(root) + " is not a rank" + where(rank_));
  }
  CallDescriptor call{CallKind::Broadcast, dtype, count, root};
  return enqueue(call, [=, this] {
    if (count == 0 || world_size_ == 1) return;
    gloo::BroadcastOptions options(context_);
    options.setOutput(static_cast<char*>(data), count * size_of(dtype));
    options.setRoot(root);
    options.setTag(next_tag());
    gloo::broadcast(options);
  });
}

Work GlooCommunicator::allgather(const void* in, void* out, std::size_t count, DType dtype,
                                 const CollectiveOptions&) {
  CallDescriptor call{CallKind::Allgather, dtype, count, 0};
  return enqueue(call, [=, this] {
    const std::size_t bytes = count * size_of(dtype);
    if (bytes == 0) return;
    if (world_size_ == 1) {
      std::memmove(out, in, bytes);
      return;
    }
    gloo::AllgatherOptions options(context_);
    options.setInput(const_cast<char*>(static_cast<const char*>(in)), bytes);
    options.setOutput(static_cast<char*>(out), bytes * world_size_);
    options.setTag(next_tag());
    gloo::allgather(options);
  });
}

// Gloo 0.5 has no stand-alone reduce-scatter with options; an all-reduce of the whole input
// followed by taking this rank's slice gives the same result at twice the traffic.
Work GlooCommunicator::reduce_scatter(const void* in, void* out, std::size_t count, DType dtype,
                                      ReduceOp op, const CollectiveOptions&) {
  CallDescriptor call{CallKind::ReduceScatter, dtype, count, static_cast<std::int64_t>(op)};
  return enqueue(call, [=, this] {
    const std::size_t bytes = count * size_of(dtype);
    if (bytes == 0) return;
    std::vector<char> scratch(static_cast<const char*>(in),
                              static_cast<const char*>(in) + bytes * world_size_);
    run_allreduce(scratch.data(), count * world_size_, dtype, op);
    std::memcpy(out, scratch.data() + bytes * rank_, bytes);
  });
}

std::shared_ptr<void> GlooCommunicator::allocate(std::size_t bytes) {
  // Zeroed host memory; the aliasing pointer keeps the owning vector alive.
  auto owner = std::make_shared<std::vector<std::byte>>(std::max<std::size_t>(bytes, 1));
  return std::shared_ptr<void>(owner, owner->data());
}

void GlooCommunicator::fill_zero(void* data, std::size_t bytes, void*) {
  std::memset(data, 0, bytes);
}

Work GlooCommunicator::barrier() {
  return enqueue(CallDescriptor{}, [this] {
    if (world_size_ == 1) return;
    gloo::BarrierOptions options(context_);
    options.setTag(next_tag());
    gloo::barrier(options);
  });
}

}  // namespace ddp::detail
