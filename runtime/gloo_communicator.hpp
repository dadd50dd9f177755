#pragma once
// The CPU backend: Gloo over TCP, a full mesh built through the store. Collectives run on
// one communication thread in issue order, so asynchronous calls overlap with the caller's
// compute. Internal to libddp; programs reach it through Context.

#include <netinet/in.h>

#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "call_check.hpp"
#include "ddp/common/task_queue.hpp"
#include "ddp/communicator.hpp"
#include "ddp/store/store.hpp"
#include "promise_work.hpp"
#include "shm_allreduce.hpp"

namespace gloo {
class Context;
}

namespace ddp::detail {

class GlooStoreAdapter;

struct GlooOptions {
  std::string hostname;                       // address the TCP device binds to; "" = host name
  std::chrono::milliseconds connect_timeout;  // building the full mesh
  std::chrono::milliseconds timeout;          // each collective
  MismatchCheck mismatch_check = MismatchCheck::FirstCall;
  bool shared_memory = false;  // all ranks on this node: all-reduce through shared memory
};

class GlooCommunicator : public Communicator {
 public:
  // Connects to every other rank through `store` (a view private to this communicator).
  // Blocks until the mesh is complete; throws InitError naming this rank and address.
  GlooCommunicator(store::Store& store, int rank, int world_size, const GlooOptions& options);
  ~GlooCommunicator() override;

  Backend backend() const override { return Backend::Gloo; }
  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }

  Work allreduce(void* data, std::size_t count, DType dtype, ReduceOp op,
                 const CollectiveOptions& options) override;
  Work broadcast(void* data, std::size_t count, DType dtype, int root,
                 const CollectiveOptions& options) override;
  Work allgather(const void* in, void* out, std::size_t count, DType dtype,
                 const CollectiveOptions& options) override;
  Work reduce_scatter(const void* in, void* out, std::size_t count, DType dtype, ReduceOp op,
                      const CollectiveOptions& options) override;
  Work barrier() override;
  std::shared_ptr<void> allocate(std::size_t bytes) override;
  void fill_zero(void* data, std::size_t bytes, void* stream) override;
  void set_mismatch_check(MismatchCheck check) override { policy_.set(check); }
  // Queued collectives fail at once, and so do their records; the running one is cut short
  // (the sockets to the peers are shut down, a shared-memory wait is interrupted) and fails
  // with `reason`; later calls throw. The peers' collectives with this rank fail too
  // ("Connection closed by peer"). Thread-safe.
  void abort(const std::string& reason) override;
  bool aborted() const override { return aborted_.load(); }

 private:
  // Queues body on the communication thread after an optional cross-rank check of `call`,
  // and records the call (with its Reducer bucket, if any) when recording is on.
  Work enqueue(const CallDescriptor& call, std::function<void()> body,
               std::optional<std::size_t> bucket = std::nullopt);
  void check_call(const CallDescriptor& call);
  void run_allreduce(void* data, std::size_t count, DType dtype, ReduceOp op);
  // All-reduces F32 data through a 16-bit copy (F16 or BF16).
  void run_compressed_allreduce(float* data, std::size_t count, DType wire, ReduceOp op);
  std::uint32_t next_tag() { return next_tag_++; }
  // Notes the two ends of each of the mesh's connections (abort shuts those sockets down).
  void note_mesh_endpoints(gloo::Context& context, const GlooStoreAdapter& adapter);

  const int rank_;
  const int world_size_;
  const std::chrono::milliseconds timeout_;
  std::shared_ptr<gloo::Context> context_;
  std::unique_ptr<ShmAllreduce> shm_;  // null: all-reduce over Gloo's TCP pairs
  // The mesh's connections: this side's pair addresses, and the peers' for this rank.
  std::vector<sockaddr_storage> own_endpoints_;
  std::vector<sockaddr_storage> peer_endpoints_;
  MismatchPolicy policy_;
  std::uint32_t next_tag_ = 0;               // used on the communication thread only
  std::exception_ptr first_failure_;         // used on the communication thread only
  std::vector<std::uint16_t> wire_scratch_;  // compressed all-reduce; communication thread only
  std::mutex abort_mutex_;
  std::atomic<bool> aborted_{false};  // set with abort_reason_
  std::string abort_reason_;          // guarded by abort_mutex_; "" until aborted
  // Guarded by abort_mutex_: not started yet, with each one's record number (0: unrecorded).
  std::deque<std::pair<std::shared_ptr<PromiseWork>, std::uint64_t>> queued_;
  common::TaskQueue queue_;  // last: its thread stops before the rest goes
};

}  // namespace ddp::detail
