#pragma once
// All-reduce through shared memory for ranks on one node: each rank copies a chunk of its
// buffer into its slot of a shared segment, reduces its own 1/world of the chunk across all
// slots, and copies the reduced chunk back. Far fewer bytes move than through loopback TCP,
// and no system call but the futex waits of two barriers per chunk.
//
// Threading: one thread per rank calls allreduce (the Gloo communication thread); every rank
// must call it with the same count, dtype and op. Internal to libddp.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "ddp/store/store.hpp"
#include "ddp/types.hpp"

namespace ddp::detail {

class ShmAllreduce {
 public:
  // Bytes of one rank's slot: a chunk of the buffer moves through it at a time.
  static constexpr std::size_t kSlotBytes = std::size_t{4} << 20;

  // Collective over the store: rank 0 creates the segment and publishes its name, the others
  // map it; the name is unlinked once every rank answered. Returns nullptr on every rank
  // when any rank could not map it (the caller falls back to TCP). `timeout` bounds each
  // barrier wait later.
  static std::unique_ptr<ShmAllreduce> create(store::Store& store, int rank, int world_size,
                                              std::chrono::milliseconds timeout);
  // Takes over a mapping of segment_bytes(world_size) bytes at base; create() makes them.
  ShmAllreduce(void* base, std::size_t bytes, int rank, int world_size,
               std::chrono::milliseconds timeout);
  ~ShmAllreduce();
  ShmAllreduce(const ShmAllreduce&) = delete;
  ShmAllreduce& operator=(const ShmAllreduce&) = delete;

  // In place over count elements. Throws CommError when another rank does not reach a
  // barrier within the timeout, or called it with another count, dtype or op (every rank
  // throws then).
  void allreduce(void* data, std::size_t count, DType dtype, ReduceOp op);

  // From any thread: the all-reduce now waiting at a barrier, and every later one, throws
  // CommError at once (Communicator::abort). The other ranks' waits are theirs to end.
  void interrupt();

  struct Header;

 private:
  static std::size_t segment_bytes(int world_size);
  Header& header() const;
  char* slot(int rank) const;  // rank == world_size: the reduced chunk
  void barrier();
  // Throws CommError when the ranks' calls (in the header) differ.
  void check_calls(std::uint64_t mine);

  void* base_;
  std::size_t bytes_;
  int rank_;
  int world_size_;
  std::chrono::milliseconds timeout_;
  std::atomic<bool> interrupted_{false};
};

}  // namespace ddp::detail
