#pragma once
// ddp::init() and the Context it returns: who this worker is, the job's store, and a ready
// communicator with typed collectives.

#include <chrono>
#include <concepts>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>

#include "ddp/communicator.hpp"
#include "ddp/launch_env.hpp"
#include "ddp/store/store.hpp"
#include "ddp/types.hpp"
#include "ddp/work.hpp"

namespace ddp {

// How long init() waits for the store and for every rank to join the communicator.
inline constexpr std::chrono::milliseconds kDefaultInitTimeout = std::chrono::minutes(5);
// Worlds larger than this use ncclCommInitRankScalable (several unique ids).
inline constexpr int kDefaultNcclScalableThreshold = 128;

struct InitOptions {
  // Backend; unset: the DDP_BACKEND variable (nccl|gloo), else NCCL when built with it and a
  // CUDA device exists, else Gloo.
  std::optional<Backend> backend;
  std::chrono::milliseconds init_timeout = kDefaultInitTimeout;   // store + communicator
  std::chrono::milliseconds timeout = kDefaultCollectiveTimeout;  // each synchronous call
  // Address Gloo's TCP device binds to; "": DDP_LOCAL_ADDR, else 127.0.0.1 when the whole job
  // runs on this node, else the host name.
  std::string local_addr;
  int cuda_device = -1;  // NCCL: -1 = local rank modulo the device count
  int nccl_scalable_threshold = kDefaultNcclScalableThreshold;  // see above
  // Cross-rank comparison of collective calls; unset: Always when DDP_DEBUG=1, else FirstCall.
  std::optional<MismatchCheck> mismatch_check;
  // Gloo with every rank on this node: all-reduce through a shared-memory segment instead of
  // loopback TCP (DDP_SHM=0 turns it off).
  bool shared_memory = true;
  // The collective record (docs/runtime.md): a descriptor of the zeroed page the agent made
  // (ddprun passes it in DDPRUN_RECORD_FD). Unset: that variable, when set; -1: off. Tests
  // that run ranks as threads give each rank a page of its own here.
  std::optional<int> record_fd;
};

class Context {
 public:
  // Assembles a context from its parts; init() is the usual way to get one. `keep_alive`
  // holds whatever the store needs (the server rank 0 hosts), released last.
  Context(LaunchEnv env, std::shared_ptr<store::Store> store,
          std::unique_ptr<Communicator> communicator, std::chrono::milliseconds timeout,
          std::shared_ptr<void> keep_alive = nullptr);
  Context(Context&&) noexcept;
  Context& operator=(Context&&) noexcept;
  ~Context();

  int rank() const { return env_.rank; }
  int world_size() const { return env_.world_size; }
  int local_rank() const { return env_.local_rank; }
  int local_world_size() const { return env_.local_world_size; }
  const LaunchEnv& env() const { return env_; }
  Backend backend() const { return communicator_->backend(); }
  // This job's keys: a view under ddp/attempt_<restart>/ of the launcher's store.
  store::Store& store() { return *store_; }
  std::shared_ptr<store::Store> shared_store() { return store_; }
  Communicator& communicator() { return *communicator_; }
  // The timeout of the synchronous calls below.
  std::chrono::milliseconds timeout() const { return timeout_; }

  // Collectives over memory of the backend's kind (host for Gloo; device or host for NCCL).
  // The synchronous forms wait up to timeout(); the _async forms return a Work.
  template <Element T>
  Work allreduce_async(std::span<T> data, ReduceOp op = ReduceOp::Sum) {
    return communicator_->allreduce(data.data(), data.size(), dtype_of<T>, op);
  }
  template <Element T>
  void allreduce(std::span<T> data, ReduceOp op = ReduceOp::Sum) {
    allreduce_async(data, op).wait(timeout_);
  }

  template <Element T>
  Work broadcast_async(std::span<T> data, int root = 0) {
    return communicator_->broadcast(data.data(), data.size(), dtype_of<T>, root);
  }
  template <Element T>
  void broadcast(std::span<T> data, int root = 0) {
    broadcast_async(data, root).wait(timeout_);
  }

  // out.size() must be world_size() * in.size().
  template <typename In, Element T>
  requires std::same_as<std::remove_const_t<In>, T> Work allgather_async(std::span<In> in,
                                                                         std::span<T> out) {
    check_sizes("allgather", in.size(), out.size());
    return communicator_->allgather(in.data(), out.data(), in.size(), dtype_of<T>);
  }
  template <typename In, Element T>
  requires std::same_as<std::remove_const_t<In>, T>
  void allgather(std::span<In> in, std::span<T> out) { allgather_async(in, out).wait(timeout_); }

  // in.size() must be world_size() * out.size(); out gets this rank's reduced slice.
  template <typename In, Element T>
  requires std::same_as<std::remove_const_t<In>, T> Work
  reduce_scatter_async(std::span<In> in, std::span<T> out, ReduceOp op = ReduceOp::Sum) {
    check_sizes("reduce_scatter", out.size(), in.size());
    return communicator_->reduce_scatter(in.data(), out.data(), out.size(), dtype_of<T>, op);
  }
  template <typename In, Element T>
  requires std::same_as<std::remove_const_t<In>, T>
  void reduce_scatter(std::span<In> in, std::span<T> out, ReduceOp op = ReduceOp::Sum) {
    reduce_scatter_async(in, out, op).wait(timeout_);
  }

  Work barrier_async() { return communicator_->barrier(); }
  void barrier() { barrier_async().wait(timeout_); }

  // Ends this rank's communication (Communicator::abort): every pending and later collective
  // fails with CommError carrying `reason`. Thread-safe; for a program (or its hang handling)
  // that must end a stuck rank, and before freeing GPU memory on an error path: cudaFree
  // synchronises the device, which never finishes behind a collective waiting for a lost
  // peer. Afterwards the Context can only be destroyed.
  void abort(const std::string& reason) { communicator_->abort(reason); }

 private:
  // Throws CommError unless whole == world_size() * part.
  void check_sizes(const char* op, std::size_t part, std::size_t whole) const;

  LaunchEnv env_;
  std::shared_ptr<void> keep_alive_;  // destroyed last
  std::shared_ptr<store::Store> store_;
  std::unique_ptr<Communicator> communicator_;
  std::chrono::milliseconds timeout_;
};

// Reads the launcher's environment (LaunchEnv), connects to the store (rank 0 hosts it
// unless TORCHELASTIC_USE_AGENT_STORE=True, as with PyTorch's env://), and builds the
// communicator. Blocks until every rank joined or options.init_timeout passed; throws
// EnvError or InitError naming what was missing.
Context init(const InitOptions& options = {});

// The same with the world given explicitly and an existing store (ranks as threads over a
// MemoryStore, or a program with its own rendezvous). Keys go under ddp/attempt_<restart>/.
Context init(const LaunchEnv& env, std::shared_ptr<store::Store> store,
             const InitOptions& options = {});

}  // namespace ddp
