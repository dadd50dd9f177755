#pragma once
// The one C++ writer of the collective record page (collective_record.hpp): finds the page a
// worker inherited, maps it, claims it for the process, publishes its header, and numbers and
// records one lane's collectives. libddp's CollectiveRecorder (one writer per communicator,
// each on a lane of its own) and the NCCL profiler plugin (one writer, lane 0) write the page
// only through it; ddprun's Python probe has its own writer (worker/python/_ddprun_record.py)
// that keeps the same rules.
//
// Threads: the page calls (map, claim_page, write_header, open_lane, use_lane, publish) are
// made by one thread before any lane call. Of the lane calls, on_queued is the issuing
// thread's (one per lane); on_started / on_finished may come from other threads, in any
// order: writers of one slot take turns through its seqlock, and a slot's collective is
// checked again under the claim. on_p2p and close_lane are one thread's at a time.
//
// Cost: the lane calls are a handful of relaxed atomic stores into the mapped page and a clock
// read (vDSO): no syscall, no lock, no allocation.

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <utility>

#include "ddp/common/collective_record.hpp"
#include "ddp/common/worker_contract.hpp"

namespace ddp::record {

// Who records in a lane: the first words of its header.
struct LaneOwner {
  std::uint64_t context = 0;     // which Context of the process (1, 2, ...); picks the lane
  std::uint64_t backend = 0;     // pack_name("gloo") / pack_name("nccl")
  std::uint64_t rank = 0;        // in the communicator
  std::uint64_t world_size = 0;  // the communicator's
  std::uint64_t timeout_ms = 0;  // the collective timeout the program waits with; 0: unknown
};

class RecordPageWriter {
 public:
  // The descriptor DDPRUN_RECORD_FD names. nullopt, silently, when the variable is unset or
  // empty (not under ddprun); nullopt and one line in `problem` when it is not a descriptor
  // number.
  static std::optional<int> fd_from_environment(std::string& problem) {
    const char* value = std::getenv(contract::kRecordFd);
    if (value == nullptr || *value == '\0') return std::nullopt;
    int fd = -1;
    const char* end = value + std::strlen(value);
    const auto [ptr, ec] = std::from_chars(value, end, fd);
    if (ec != std::errc() || ptr != end || fd < 0) {
      problem = std::string(contract::kRecordFd) + "='" + value + "' is not a descriptor number";
      return std::nullopt;
    }
    return fd;
  }

  // How the messages name descriptor `fd`.
  static std::string descriptor_name(int fd) {
    return "the collective record descriptor " + std::to_string(fd);
  }

  // Maps the record page `fd`. nullopt and one line in `problem` when it is no usable page:
  // not open, of another size, or not mappable. `name` names the descriptor in that line,
  // `launcher` the program that made a page of another size ("a ddprun").
  static std::optional<RecordPageWriter> map(int fd, const std::string& name, const char* launcher,
                                             std::string& problem) {
    struct stat st {};
    if (fstat(fd, &st) != 0) {
      problem = name + " is not open: " + std::strerror(errno);
      return std::nullopt;
    }
    if (static_cast<std::uint64_t>(st.st_size) != sizeof(RecordPage)) {
      problem = name + " has " + std::to_string(st.st_size) + " bytes, not the " +
                std::to_string(sizeof(RecordPage)) + " of a record page (" + launcher +
                " of another version?)";
      return std::nullopt;
    }
    void* mapped = mmap(nullptr, sizeof(RecordPage), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (mapped == MAP_FAILED) {
      problem = name + " could not be mapped: " + std::strerror(errno);
      return std::nullopt;
    }
    return RecordPageWriter(static_cast<RecordPage*>(mapped));
  }

  ~RecordPageWriter() {
    if (page_ != nullptr) munmap(page_, sizeof(RecordPage));
  }
  RecordPageWriter(RecordPageWriter&& other) noexcept
      : page_(std::exchange(other.page_, nullptr)),
        lane_index_(other.lane_index_),
        lane_(other.lane_),
        next_seq_(other.next_seq_) {}
  RecordPageWriter(const RecordPageWriter&) = delete;
  RecordPageWriter& operator=(const RecordPageWriter&) = delete;
  RecordPageWriter& operator=(RecordPageWriter&&) = delete;

  // This process, as the page's `pid` names it.
  static std::uint64_t this_process() { return static_cast<std::uint64_t>(getpid()); }

  // Claims the page for this process: a compare-exchange of `pid` from 0. Returns the owner
  // it found: 0 when this call claimed the page, this_process() when the process had already,
  // another pid when the page is that process's (a child that inherited the descriptor leaves
  // it to its owner).
  std::uint64_t claim_page() {
    std::uint64_t owner = 0;
    page_->pid.compare_exchange_strong(owner, this_process(), std::memory_order_acq_rel);
    return owner;
  }

  // The header's version and the claimer's rank and world size; publish() makes them visible.
  void write_header(std::uint64_t rank, std::uint64_t world_size) {
    page_->version.store(kRecordVersion, std::memory_order_relaxed);
    page_->rank.store(rank, std::memory_order_relaxed);
    page_->world_size.store(world_size, std::memory_order_relaxed);
  }

  // Claims a lane for `owner`: its Context's own ((context - 1) % kCommunicatorLanes, the same
  // on every rank), else the next free one (unused or closed), by a compare-exchange of its
  // state; names the owner there, opens the lane and records into it from now on. False when
  // every lane is taken: then nothing is recorded.
  bool open_lane(const LaneOwner& owner) {
    const int index = claim_lane(owner.context);
    if (index < 0) return false;
    Lane lane = lane_of(*page_, static_cast<std::uint32_t>(index));
    lane.context->store(owner.context, std::memory_order_relaxed);
    lane.backend->store(owner.backend, std::memory_order_relaxed);
    lane.rank->store(owner.rank, std::memory_order_relaxed);
    lane.world_size->store(owner.world_size, std::memory_order_relaxed);
    lane.timeout_ms->store(owner.timeout_ms, std::memory_order_relaxed);
    // A destroyed communicator's collectives that never finished are gone with it.
    const std::uint64_t queued = lane.queued->load(std::memory_order_relaxed);
    if (lane.finished->load(std::memory_order_relaxed) < queued) {
      lane.finished->store(queued, std::memory_order_release);
    }
    lane.state->store(static_cast<std::uint64_t>(LaneState::kOpen), std::memory_order_release);
    use_lane(static_cast<std::uint32_t>(index));
    return true;
  }

  // Records into lane `index` (< kCommunicatorLanes), which the caller owns, from now on; its
  // numbers go on from its last collective.
  void use_lane(std::uint32_t index) {
    lane_index_ = static_cast<int>(index);
    lane_ = lane_of(*page_, index);
    next_seq_ = lane_.queued->load(std::memory_order_relaxed);
  }

  // Publishes the header by storing kRecordMagic last (release), unless it was published.
  void publish() {
    if (page_->magic.load(std::memory_order_acquire) != kRecordMagic) {
      page_->magic.store(kRecordMagic, std::memory_order_release);
    }
  }

  // The lane this writer records into (0, 1, ...); -1: none, and the calls below do nothing.
  int lane() const { return lane_index_; }

  // A collective was issued: numbers it (1, 2, ...) and records it. `dtype` is pack_name of
  // its type's name (0 for none), `bucket` a Reducer bucket or kNoBucket. Every collective is
  // counted (ranks must agree on the numbers), but one whose slot still holds an unfinished
  // collective (more than a ring in flight) is not written there. Returns its number; 0
  // without a lane.
  std::uint64_t on_queued(Op op, std::uint64_t dtype, std::uint64_t count, std::uint64_t bytes,
                          std::uint64_t bucket) {
    if (lane_index_ < 0) return 0;
    const std::uint64_t seq = ++next_seq_;
    const std::uint64_t now = now_ns();
    if (seq <= kCollectiveSlots ||
        lane_.finished->load(std::memory_order_acquire) >= seq - kCollectiveSlots) {
      CollectiveSlot& slot = lane_.collectives[seq % kCollectiveSlots];
      begin_write(slot);
      slot.seq.store(seq, std::memory_order_relaxed);
      slot.op.store(static_cast<std::uint64_t>(op), std::memory_order_relaxed);
      slot.dtype.store(dtype, std::memory_order_relaxed);
      slot.count.store(count, std::memory_order_relaxed);
      slot.bytes.store(bytes, std::memory_order_relaxed);
      slot.bucket.store(bucket, std::memory_order_relaxed);
      slot.queued_ns.store(now, std::memory_order_relaxed);
      slot.started_ns.store(0, std::memory_order_relaxed);
      slot.finished_ns.store(0, std::memory_order_relaxed);
      slot.failed.store(0, std::memory_order_relaxed);
      end_write(slot);
    }
    lane_.queued->store(seq, std::memory_order_release);
    return seq;
  }

  // Collective `seq` began to run.
  void on_started(std::uint64_t seq) {
    if (lane_index_ < 0 || seq == 0) return;
    const std::uint64_t now = now_ns();
    in_slot(seq,
            [&](CollectiveSlot& slot) { slot.started_ns.store(now, std::memory_order_relaxed); });
    raise(*lane_.started, seq);
  }

  // Collective `seq` completed, with an error when `failed`.
  void on_finished(std::uint64_t seq, bool failed) {
    if (lane_index_ < 0 || seq == 0) return;
    const std::uint64_t now = now_ns();
    in_slot(seq, [&](CollectiveSlot& slot) {
      slot.finished_ns.store(now, std::memory_order_relaxed);
      slot.failed.store(failed ? 1 : 0, std::memory_order_relaxed);
    });
    if (failed) lane_.failed->store(1, std::memory_order_relaxed);
    lane_.last_finished_ns->store(now, std::memory_order_relaxed);
    // Release: the issuing thread may reuse this slot once it sees `finished` pass it.
    raise(*lane_.finished, seq);
  }

  // The oldest send or recv of the lane not yet done (sends and receives are not numbered:
  // one rank's send meets one rank's recv, and ranks send and receive unevenly), issued at
  // since_ns, to or from `peer` (kNoPeer: any); since_ns 0: none.
  void on_p2p(std::uint64_t since_ns, Op op, std::uint64_t bytes, std::uint64_t peer) {
    if (lane_index_ < 0) return;
    if (since_ns != 0) {
      lane_.p2p_op->store(static_cast<std::uint64_t>(op), std::memory_order_relaxed);
      lane_.p2p_bytes->store(bytes, std::memory_order_relaxed);
      lane_.p2p_peer->store(peer, std::memory_order_relaxed);
    }
    lane_.p2p_since_ns->store(since_ns, std::memory_order_release);  // last: the reader's key
  }

  // Gives the lane back (closed: the agent still reads it, for a rank that exited). What never
  // finished is gone with its communicator: recorded as failed, not pending for ever.
  void close_lane() {
    if (lane_index_ < 0) return;
    const std::uint64_t queued = lane_.queued->load(std::memory_order_relaxed);
    std::uint64_t seq = lane_.finished->load(std::memory_order_relaxed) + 1;
    if (queued > kCollectiveSlots) seq = std::max(seq, queued - kCollectiveSlots + 1);
    for (; seq <= queued; ++seq) on_finished(seq, true);
    lane_.state->store(static_cast<std::uint64_t>(LaneState::kClosed), std::memory_order_release);
  }

  // The mapped page, for what is not a lane's: the Reducer's steps, the agent's stop request,
  // the plugin's writer word.
  RecordPage& page() { return *page_; }
  const RecordPage& page() const { return *page_; }

 private:
  // Writes collective `seq`'s slot under its seqlock, while the slot still holds `seq`:
  // checked again under the claim, since the issuing thread may have reused it for
  // seq + kCollectiveSlots once a later collective finished.
  template <class Write>
  void in_slot(std::uint64_t seq, Write write) {
    CollectiveSlot& slot = lane_.collectives[seq % kCollectiveSlots];
    if (slot.seq.load(std::memory_order_relaxed) != seq) return;
    begin_write(slot);
    if (slot.seq.load(std::memory_order_relaxed) == seq) write(slot);
    end_write(slot);
  }

  explicit RecordPageWriter(RecordPage* page) : page_(page) {}

  // The lane claimed for Context `context` (see open_lane); -1: none is free.
  int claim_lane(std::uint64_t context) {
    const auto own =
        static_cast<std::uint32_t>((context == 0 ? 0 : context - 1) % kCommunicatorLanes);
    for (std::uint32_t i = 0; i < kCommunicatorLanes; ++i) {
      const std::uint32_t index = (own + i) % kCommunicatorLanes;
      std::atomic<std::uint64_t>& state = *lane_of(*page_, index).state;
      std::uint64_t seen = state.load(std::memory_order_acquire);
      while (seen == static_cast<std::uint64_t>(LaneState::kUnused) ||
             seen == static_cast<std::uint64_t>(LaneState::kClosed)) {
        if (state.compare_exchange_weak(seen, static_cast<std::uint64_t>(LaneState::kClaiming),
                                        std::memory_order_acq_rel)) {
          return static_cast<int>(index);
        }
      }
    }
    return -1;
  }

  // Moves a counter of collective numbers up to `seq` (release), never down: its writers
  // finish collectives in any order.
  static void raise(std::atomic<std::uint64_t>& counter, std::uint64_t seq) {
    std::uint64_t highest = counter.load(std::memory_order_relaxed);
    while (highest < seq && !counter.compare_exchange_weak(highest, seq, std::memory_order_release,
                                                           std::memory_order_relaxed)) {
    }
  }

  RecordPage* page_;            // mapped MAP_SHARED; unmapped by the destructor; null once moved
  int lane_index_ = -1;         // -1: no lane
  Lane lane_{};                 // its words; null pointers without a lane
  std::uint64_t next_seq_ = 0;  // the issuing thread's: the last number given
};

}  // namespace ddp::record
