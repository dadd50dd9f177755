#include "shm_allreduce.hpp"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>
#include <random>

#include "reduce_kernels.hpp"

namespace ddp::detail {

namespace {

constexpr std::size_t kHeaderBytes = 4096;

// Waits while *word == expected, at most `timeout`; returns on a wake, a change or timeout.
// Shared (not FUTEX_PRIVATE): the word lives in memory mapped by several processes.
void futex_wait(std::atomic<std::uint32_t>* word, std::uint32_t expected,
                std::chrono::nanoseconds timeout) {
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1'000'000'000);
  ts.tv_nsec = static_cast<long>(timeout.count() % 1'000'000'000);
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake_all(std::atomic<std::uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr,
          nullptr, 0);
}

void* map_segment(int fd, std::size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  return p == MAP_FAILED ? nullptr : p;
}

std::string segment_name() {
  std::random_device rd;
  return "/ddp-allreduce-" + std::to_string(::getpid()) + "-" + std::to_string(rd());
}

}  // namespace

// Ranks a segment's header has a call word for.
constexpr int kMaxShmRanks = 496;

// The barrier: ranks count themselves in `arrived`; the last one resets it and bumps
// `generation`, which the others wait on. `calls`: what each rank called (count, dtype, op),
// compared after the first barrier of every all-reduce.
struct ShmAllreduce::Header {
  alignas(64) std::atomic<std::uint32_t> arrived;
  alignas(64) std::atomic<std::uint32_t> generation;
  alignas(64) std::atomic<std::uint64_t> calls[kMaxShmRanks];
};
static_assert(sizeof(ShmAllreduce::Header) <= 4096);
static_assert(std::atomic<std::uint32_t>::is_always_lock_free);

std::size_t ShmAllreduce::segment_bytes(int world_size) {
  return kHeaderBytes + static_cast<std::size_t>(world_size + 1) * kSlotBytes;
}

std::unique_ptr<ShmAllreduce> ShmAllreduce::create(store::Store& store, int rank, int world_size,
                                                   std::chrono::milliseconds timeout) {
  if (world_size > kMaxShmRanks) return nullptr;  // every rank alike: all fall back to TCP
  const std::size_t bytes = segment_bytes(world_size);
  void* base = nullptr;
  std::string name;
  if (rank == 0) {
    name = segment_name();
    const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd >= 0) {
      // Reserve the pages now: a tmpfs too small for the segment (a container's 64 MiB
      // /dev/shm) fails here, and every rank falls back to TCP, instead of killing a rank
      // with SIGBUS when it first touches a page past the limit.
      if (ftruncate(fd, static_cast<off_t>(bytes)) == 0 &&
          posix_fallocate(fd, 0, static_cast<off_t>(bytes)) == 0) {
        base = map_segment(fd, bytes);
      }
      ::close(fd);
      if (base != nullptr) ::new (base) Header{};  // starts the atomics' lifetime, zeroed
    }
    if (base == nullptr && fd >= 0) shm_unlink(name.c_str());
  }
  // From here on, a failure (the store gone, a rank that never answers) still leaves
  // nothing behind in /dev/shm.
  auto discard = [&] {
    if (rank == 0 && base != nullptr) shm_unlink(name.c_str());
    if (base != nullptr) munmap(base, bytes);
  };
  std::vector<std::string> answers;
  try {
    if (rank == 0) store.set("shm/name", base ? name : "");
  } catch (...) {
    discard();
    throw;
  }
  if (rank != 0) {
    name = store.get("shm/name");
    if (!name.empty()) {
      const int fd = shm_open(name.c_str(), O_RDWR, 0600);
      if (fd >= 0) {
        base = map_segment(fd, bytes);
        ::close(fd);
      }
    }
  }
  std::vector<std::string> keys;
  for (int r = 0; r < world_size; ++r) keys.push_back("shm/ok/" + std::to_string(r));
  try {
    store.set("shm/ok/" + std::to_string(rank), base ? "1" : "0");
    answers = store.multi_get(keys);
  } catch (...) {  // a rank never answered
    discard();
    throw;
  }
  if (rank == 0 && base != nullptr) shm_unlink(name.c_str());  // every rank has answered
  const bool all = std::all_of(answers.begin(), answers.end(), [](auto& a) { return a == "1"; });
  if (!all) {
    if (base != nullptr) munmap(base, bytes);
    return nullptr;
  }
  return std::make_unique<ShmAllreduce>(base, bytes, rank, world_size, timeout);
}

ShmAllreduce::ShmAllreduce(void* base, std::size_t bytes, int rank, int world_size,
                           std::chrono::milliseconds timeout)
    : base_(base), bytes_(bytes), rank_(rank), world_size_(world_size), timeout_(timeout) {}

ShmAllreduce::~ShmAllreduce() { munmap(base_, bytes_); }

void ShmAllreduce::interrupt() {
  interrupted_.store(true, std::memory_order_release);
  // Wakes every waiter on the word, the other ranks' too: they see no new generation and wait
  // again; this rank's sees the flag.
  futex_wake_all(&header().generation);
}

ShmAllreduce::Header& ShmAllreduce::header() const { return *static_cast<Header*>(base_); }

char* ShmAllreduce::slot(int rank) const {
  return static_cast<char*>(base_) + kHeaderBytes + static_cast<std::size_t>(rank) * kSlotBytes;
}

void ShmAllreduce::barrier() {
  Header& h = header();
  auto interrupted = [this] {
    return CommError("rank " + std::to_string(rank_) +
                     ": shared-memory all-reduce: interrupted (the communicator was aborted)");
  };
  if (interrupted_.load(std::memory_order_acquire)) throw interrupted();
  const std::uint32_t generation = h.generation.load(std::memory_order_acquire);
  if (h.arrived.fetch_add(1, std::memory_order_acq_rel) + 1 ==
      static_cast<std::uint32_t>(world_size_)) {
    h.arrived.store(0, std::memory_order_relaxed);
    h.generation.fetch_add(1, std::memory_order_acq_rel);
    futex_wake_all(&h.generation);
    return;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  while (h.generation.load(std::memory_order_acquire) == generation) {
    if (interrupted_.load(std::memory_order_acquire)) throw interrupted();
    const auto left = deadline - std::chrono::steady_clock::now();
    if (left <= std::chrono::nanoseconds::zero()) {
      throw CommError("rank " + std::to_string(rank_) +
                      ": shared-memory all-reduce: the other ranks did not reach the barrier "
                      "within " +
                      std::to_string(timeout_.count()) + " ms");
    }
    futex_wait(&h.generation, generation, left);
  }
}

namespace {

// count (48 bits), dtype, op: what every rank must call alike.
std::uint64_t call_word(std::size_t count, DType dtype, ReduceOp op) {
  return (static_cast<std::uint64_t>(count) << 16) | (static_cast<std::uint64_t>(dtype) << 8) |
         static_cast<std::uint64_t>(op);
}

std::string call_text(std::uint64_t word) {
  return std::to_string(word >> 16) + " " + to_string(static_cast<DType>((word >> 8) & 0xff)) +
         " (" + to_string(static_cast<ReduceOp>(word & 0xff)) + ")";
}

}  // namespace

// Every rank's call is compared with rank 0's after the first barrier, so that ranks that
// called it differently (a desync) all fail at once with the same error instead of reducing
// garbage or falling out of step on the barriers.
void ShmAllreduce::check_calls(std::uint64_t mine) {
  const std::uint64_t reference = header().calls[0].load(std::memory_order_relaxed);
  for (int r = 1; r < world_size_; ++r) {
    const std::uint64_t theirs = header().calls[r].load(std::memory_order_relaxed);
    if (theirs == reference) continue;
    throw CommError("rank " + std::to_string(rank_) + ": all_reduce desync: rank " +
                    std::to_string(r) + " called it with " + call_text(theirs) + ", rank 0 with " +
                    call_text(reference) +
                    (mine == reference ? "" : " (this rank: " + call_text(mine) + ")") +
                    "; every rank must issue the same collectives with the same count, dtype "
                    "and op, in the same order");
  }
}

void ShmAllreduce::allreduce(void* data, std::size_t count, DType dtype, ReduceOp op) {
  const std::size_t element = size_of(dtype);
  const std::size_t chunk = kSlotBytes / element;
  const ReduceFn reduce = reduce_function(dtype, op);
  auto* bytes = static_cast<char*>(data);
  // The first chunk and this rank's call, then the first barrier, also for count 0.
  const std::uint64_t mine = call_word(count, dtype, op);
  std::memcpy(slot(rank_), bytes, std::min(chunk, count) * element);
  header().calls[rank_].store(mine, std::memory_order_relaxed);
  barrier();  // every slot holds its rank's first chunk; every call is known
  check_calls(mine);
  if (count == 0) return barrier();  // nobody writes `calls` again before all have read it
  for (std::size_t offset = 0; offset < count; offset += chunk) {
    const std::size_t n = std::min(chunk, count - offset);
    if (offset > 0) {
      std::memcpy(slot(rank_), bytes + offset * element, n * element);
      barrier();  // every slot holds its rank's chunk
    }
    // This rank's share of the chunk, cut at 16-element boundaries (whole cache lines).
    const std::size_t share = (n / world_size_ + 16) & ~std::size_t{15};
    const std::size_t lo = std::min(n, share * rank_);
    const std::size_t hi = std::min(n, lo + share);
    if (lo < hi) {
      char* out = slot(world_size_) + lo * element;
      std::memcpy(out, slot(0) + lo * element, (hi - lo) * element);
      for (int r = 1; r < world_size_; ++r) reduce(out, out, slot(r) + lo * element, hi - lo);
      if (op == ReduceOp::Avg) divide(out, hi - lo, dtype, world_size_);
    }
    barrier();  // the reduced chunk is complete
    std::memcpy(bytes + offset * element, slot(world_size_), n * element);
  }
}

}  // namespace ddp::detail
