#pragma once
// The collective record: one shared-memory page per worker in which libddp records its
// collectives and Reducer steps, and from which the agent reads them at any moment, even
// when every thread of the worker is stuck. Part of the worker contract (header-only, shared
// by launcher/ and runtime/, not installed). libddp and the NCCL profiler plugin write it
// through one writer, RecordPageWriter (record_page_writer.hpp).
//
// Who does what:
// - The agent creates the page (a memfd of sizeof(RecordPage) bytes, zeroed), maps it, and
//   hands it to the worker as an inherited descriptor whose number is in DDPRUN_RECORD_FD.
// - libddp maps that descriptor and claims the page by a compare-exchange of `pid` from 0 to
//   its own pid (a child that inherited the descriptor then leaves the page alone). Every
//   communicator of the process records, each in a lane of its own (kCommunicatorLanes):
//   lane 0 is the page's own counters and ring (the header's queued... fields and
//   `collectives`), lanes 1.. are the `lanes` after the steps. A communicator takes the lane
//   of its Context's number ((context - 1) % kCommunicatorLanes: init() builds Contexts in
//   the same order on every rank, so lane i of every rank is the same communicator), else
//   any free one, by a compare-exchange of the lane's state, and gives it back when it is
//   destroyed (kClosed: what it left unfinished recorded as failed; the agent still reads a
//   closed lane); a later communicator on that lane goes on with its numbering. The first claim
//   fills the rest of the header and publishes it by storing kRecordMagic last. ddprun's
//   Python probe (worker/python/_ddprun_probe.py) claims the page by pid when the default
//   process group is made and records it in lane 0; each other process group of which the
//   rank is a member takes a free lane (up to kExtraLanes; later ones are not recorded), its
//   `context` the group's c10d name + 1 (names count the groups every rank makes, members or
//   not, so a group's context is the same on every rank while its lane may differ): readers
//   match lanes across ranks by context. A worker that does neither (a program
//   without libddp, a Python worker with the probe off) leaves magic at 0: the agent knows
//   nothing of its collectives.
// - Writes on the hot path are relaxed atomic stores of 64-bit words: no syscall, no lock,
//   no allocation. Each slot is a small seqlock (`version` is odd while the slot is written):
//   a writer claims the slot by a compare-exchange of `version` from even to odd (so two
//   threads finishing collectives k and k + 1 while a third reuses slot k take turns), and
//   the reader drops a slot it caught half-written and keeps the rest. A writer that claims
//   a slot to finish or start collective k checks the slot still holds k before it writes.
// - The issuing thread reuses a ring slot only once `finished` passed the collective it held
//   (seq - kCollectiveSlots); with more than kCollectiveSlots collectives in flight, the
//   newer one is not written to its slot (the counters still move). So the reader checks a
//   slot's `seq` before taking it for collective `seq`.
//
// Times are CLOCK_MONOTONIC nanoseconds (std::chrono::steady_clock on Linux), the same
// clock in every process of a node: the agent compares them with its own.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <thread>

#include "ddp/common/worker_contract.hpp"

namespace ddp::record {

// The page's variable, the stack file's and the stack signal's: worker_contract.hpp.
// The stack file's memfd name: the probe takes DDPRUN_STACK_FD only when it names this file
// (/proc/self/fd/N reads "/memfd:ddprun-python-stacks (deleted)").
inline constexpr const char* kStackFileName = "ddprun-python-stacks";

inline constexpr std::uint64_t kRecordMagic = 0x31304345'52504444ull;  // "DDPREC01"
inline constexpr std::uint64_t kRecordVersion = 2;                     // 2: communicator lanes
inline constexpr std::uint32_t kCollectiveSlots = 256;                 // a power of two
inline constexpr std::uint32_t kStepSlots = 64;                        // a power of two
inline constexpr std::uint32_t kCommunicatorLanes = 4;  // lane 0 and kExtraLanes in `lanes`
inline constexpr std::uint32_t kExtraLanes = 3;         // kCommunicatorLanes - 1

// A lane's state. Values are part of the page's layout.
enum class LaneState : std::uint64_t {
  kUnused = 0,
  kOpen = 1,      // a live communicator records here
  kClosed = 2,    // its communicator was destroyed; the next one may take the lane
  kClaiming = 3,  // being filled in: readers skip it
};

// The collectives a communicator numbers. Values are part of the page's layout.
enum class Op : std::uint64_t {
  kNone = 0,
  kAllReduce = 1,
  kBroadcast = 2,
  kAllGather = 3,
  kReduceScatter = 4,
  kBarrier = 5,
  // Recorded by the Python probe from PyTorch's own collectives:
  kReduce = 6,
  kGather = 7,
  kScatter = 8,
  kAllToAll = 9,
  kSend = 10,
  kRecv = 11,
  kOther = 12,
  kGradients = 13,  // DDP's gradient reduction of one step as a whole (PyTorch without hooks)
};

inline const char* op_name(std::uint64_t op) {
  switch (static_cast<Op>(op)) {
    case Op::kAllReduce:
      return "all_reduce";
    case Op::kBroadcast:
      return "broadcast";
    case Op::kAllGather:
      return "all_gather";
    case Op::kReduceScatter:
      return "reduce_scatter";
    case Op::kBarrier:
      return "barrier";
    case Op::kReduce:
      return "reduce";
    case Op::kGather:
      return "gather";
    case Op::kScatter:
      return "scatter";
    case Op::kAllToAll:
      return "all_to_all";
    case Op::kSend:
      return "send";
    case Op::kRecv:
      return "recv";
    case Op::kOther:
      return "collective";
    case Op::kGradients:
      return "DDP gradient all-reduce";
    case Op::kNone:
      break;
  }
  return "unknown";
}

// Up to 8 characters of a name packed into one word (little end first), so that a slot can
// carry "float32" or "bfloat16" without a pointer.
inline std::uint64_t pack_name(const char* name) {
  std::uint64_t word = 0;
  for (int i = 0; i < 8 && name[i] != '\0'; ++i)
    word |= static_cast<std::uint64_t>(static_cast<unsigned char>(name[i])) << (8 * i);
  return word;
}

inline std::string unpack_name(std::uint64_t word) {
  std::string name;
  for (int i = 0; i < 8; ++i) {
    const char c = static_cast<char>((word >> (8 * i)) & 0xff);
    if (c == '\0') break;
    name += c;
  }
  return name;
}

// The page is shared between processes: its atomics must be lock-free.
static_assert(std::atomic<std::uint64_t>::is_always_lock_free);

// Now on the records' clock (CLOCK_MONOTONIC: std::chrono::steady_clock on Linux), in ns.
inline std::uint64_t now_ns() {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
}

inline constexpr std::uint64_t kNoBucket = ~0ull;
inline constexpr std::uint64_t kNoPeer = ~0ull;  // a recv from any source

// One collective. Slot seq % kCollectiveSlots holds collective `seq` (1, 2, ...).
struct CollectiveSlot {
  std::atomic<std::uint64_t> version;      // seqlock: odd while written, even when stable
  std::atomic<std::uint64_t> seq;          // the collective's number; 0: never used
  std::atomic<std::uint64_t> op;           // Op
  std::atomic<std::uint64_t> dtype;        // pack_name of PyTorch's name ("float32", "bfloat16",
                                           // "int64"...): the type on the wire; 0 for a barrier
  std::atomic<std::uint64_t> count;        // elements (per rank for all_gather / reduce_scatter)
  std::atomic<std::uint64_t> bytes;        // count * element size
  std::atomic<std::uint64_t> bucket;       // Reducer bucket index, kNoBucket outside one
  std::atomic<std::uint64_t> queued_ns;    // issued by the program
  std::atomic<std::uint64_t> started_ns;   // began to run (0: not yet); Gloo: the
                                           // communication thread took it; NCCL: handed to
                                           // the stream
  std::atomic<std::uint64_t> finished_ns;  // completed (0: not yet); NCCL: the stream passed it
  std::atomic<std::uint64_t> failed;       // 1: completed with an error
  std::atomic<std::uint64_t> reserved[5];
};
static_assert(sizeof(CollectiveSlot) == 128);

// One Reducer step, from the first gradient marked ready... to finalize() returning.
// Slot step % kStepSlots holds step `step` (1, 2, ...).
struct StepSlot {
  std::atomic<std::uint64_t> version;       // seqlock, as in CollectiveSlot
  std::atomic<std::uint64_t> step;          // 0: never used
  std::atomic<std::uint64_t> begin_ns;      // the previous step's finalize returned (or the first
                                            // gradient was marked ready, for step 1)
  std::atomic<std::uint64_t> ready_ns;      // the last bucket's gradients were all ready
  std::atomic<std::uint64_t> finalized_ns;  // finalize() returned: every bucket reduced
  std::atomic<std::uint64_t> reserved[3];
};
static_assert(sizeof(StepSlot) == 64);

// Lanes 1.. : one more communicator of the process each, with the counters and ring that
// lane 0 keeps in the page header.
struct LaneHeader {
  std::atomic<std::uint64_t> state;    // LaneState
  std::atomic<std::uint64_t> context;  // which Context of the process (1, 2, ...)
  std::atomic<std::uint64_t> backend;  // pack_name("gloo") / pack_name("nccl")
  std::atomic<std::uint64_t> rank;
  std::atomic<std::uint64_t> world_size;
  std::atomic<std::uint64_t> timeout_ms;
  std::atomic<std::uint64_t> queued;  // as in RecordPage
  std::atomic<std::uint64_t> started;
  std::atomic<std::uint64_t> finished;
  std::atomic<std::uint64_t> last_finished_ns;
  std::atomic<std::uint64_t> failed;
  std::atomic<std::uint64_t> unrecorded;  // as in RecordPage
  std::atomic<std::uint64_t> p2p_since_ns;
  std::atomic<std::uint64_t> p2p_op;
  std::atomic<std::uint64_t> p2p_bytes;
  std::atomic<std::uint64_t> p2p_peer;
};
static_assert(sizeof(LaneHeader) == 128);

struct CommunicatorLane {
  LaneHeader header;
  CollectiveSlot collectives[kCollectiveSlots];
};

struct RecordPage {
  std::atomic<std::uint64_t> magic;    // kRecordMagic once the worker attached; stored last
  std::atomic<std::uint64_t> version;  // kRecordVersion
  std::atomic<std::uint64_t> pid;      // the worker process; its claim (see above)
  std::atomic<std::uint64_t> rank;     // global rank of the communicator
  std::atomic<std::uint64_t> world_size;
  std::atomic<std::uint64_t> backend;  // pack_name("gloo") / pack_name("nccl")
  // Collectives: the highest number queued, started and finished (each in issue order).
  std::atomic<std::uint64_t> queued;
  std::atomic<std::uint64_t> started;
  std::atomic<std::uint64_t> finished;
  std::atomic<std::uint64_t> last_finished_ns;  // when `finished` last moved
  std::atomic<std::uint64_t> failed;            // 1: a collective failed (the communicator broke)
  // Reducer steps.
  std::atomic<std::uint64_t> steps;             // the last step that began
  std::atomic<std::uint64_t> compute_ns_total;  // sum over steps of ready_ns - begin_ns
  std::atomic<std::uint64_t> wait_ns_total;     // sum over steps of finalized_ns - ready_ns
  // Written by the agent: nonzero once ddprun stops the job because it hung. libddp then
  // aborts its NCCL communicators, so that ranks stuck in a collective fail with a reason
  // and exit on their own (an older libddp ignores it).
  std::atomic<std::uint64_t> stop_requested;
  // Written by ddprun's Python probe (worker/python), 0 where no probe runs:
  std::atomic<std::uint64_t> writer;        // pack_name("torch") when the probe writes the page
  std::atomic<std::uint64_t> stack_signal;  // the signal on which the worker dumps every
                                            // thread's Python stack into the stack file
                                            // (faulthandler, on `stack_fd` below); ddprun
                                            // sends no other, and only while the worker
                                            // catches it
  // Written by whoever claims the page: the job's own collective timeout (the process group's,
  // libddp's InitOptions::timeout), after which ddprun stops a hang it is not sure of; 0:
  // unknown.
  std::atomic<std::uint64_t> timeout_ms;
  // Version 2. Lane 0 (this header's counters and `collectives`): its LaneState (the probe
  // leaves it at 0: a published page's lane 0 is read whatever it says) and which Context of
  // the process it records (1, 2, ... in init() order; 0: unknown).
  std::atomic<std::uint64_t> lane_state;
  std::atomic<std::uint64_t> context;
  // The Context whose Reducer records its steps in `step_slots` (the first to begin one).
  std::atomic<std::uint64_t> step_context;
  std::atomic<std::uint64_t> reserved[5];
  // Written by ddprun's Python probe (the other writers leave them 0), per lane: collectives
  // left unrecorded (issued by a signal handler while its thread was recording: this rank's
  // numbers then lag behind its group's), and the oldest send or recv a thread of the process
  // waits in now (p2p ops have no collective number: a send meets one recv, and ranks send
  // and receive unevenly), since when (0: none), which Op, how many bytes, to or from which
  // rank of the group (kNoPeer: any).
  std::atomic<std::uint64_t> unrecorded;
  std::atomic<std::uint64_t> p2p_since_ns;
  std::atomic<std::uint64_t> p2p_op;
  std::atomic<std::uint64_t> p2p_bytes;
  std::atomic<std::uint64_t> p2p_peer;
  // Written by ddprun's Python probe before stack_signal: the descriptor its faulthandler
  // writes stacks into (its own high, close-on-exec copy of DDPRUN_STACK_FD). ddprun sends
  // stack_signal only while that descriptor of the worker still is the stack file it made.
  std::atomic<std::uint64_t> stack_fd;
  CollectiveSlot collectives[kCollectiveSlots];
  StepSlot step_slots[kStepSlots];
  CommunicatorLane lanes[kExtraLanes];  // lanes 1, 2, ...
};
static_assert(sizeof(RecordPage) % 64 == 0);
static_assert(offsetof(RecordPage, collectives) == 32 * 8);  // the probe's HEADER_WORDS
static_assert(offsetof(RecordPage, unrecorded) == 26 * 8);   // the probe's LANE0_EXTRA
static_assert(offsetof(RecordPage, stack_fd) == 31 * 8);     // the probe's STACK_FD
static_assert(kExtraLanes == kCommunicatorLanes - 1);

// Writer side of a slot's seqlock: call begin, store the fields (relaxed), call end. begin
// claims the slot (version even -> odd); a writer that finds it claimed waits for the other
// writer's handful of stores.
template <typename Slot>
inline void begin_write(Slot& slot) {
  std::uint64_t version = slot.version.load(std::memory_order_relaxed);
  for (;;) {
    if ((version & 1) == 0 &&
        slot.version.compare_exchange_weak(version, version + 1, std::memory_order_relaxed,
                                           std::memory_order_relaxed)) {
      break;
    }
    if (version & 1) {
      std::this_thread::yield();
      version = slot.version.load(std::memory_order_relaxed);
    }
  }
  std::atomic_thread_fence(std::memory_order_release);
}
template <typename Slot>
inline void end_write(Slot& slot) {
  slot.version.fetch_add(1, std::memory_order_release);
}

// Reader side: copies a slot's fields through `copy` and returns true when they were stable.
template <typename Slot, typename Copy>
inline bool read_stable(const Slot& slot, Copy&& copy) {
  const std::uint64_t before = slot.version.load(std::memory_order_acquire);
  if (before & 1) return false;
  copy(slot);
  std::atomic_thread_fence(std::memory_order_acquire);
  return slot.version.load(std::memory_order_relaxed) == before;
}

// One lane's words, wherever they sit: lane 0 in the page header, lanes 1.. in `lanes`.
template <typename Word, typename Slot>
struct BasicLane {
  Word* state;
  Word* context;
  Word* backend;
  Word* rank;
  Word* world_size;
  Word* timeout_ms;
  Word* queued;
  Word* started;
  Word* finished;
  Word* last_finished_ns;
  Word* failed;
  Word* unrecorded;
  Word* p2p_since_ns;
  Word* p2p_op;
  Word* p2p_bytes;
  Word* p2p_peer;
  Slot* collectives;  // kCollectiveSlots of them
};
using Lane = BasicLane<std::atomic<std::uint64_t>, CollectiveSlot>;
using ConstLane = BasicLane<const std::atomic<std::uint64_t>, const CollectiveSlot>;

template <typename L, typename Page>
inline L lane_in(Page& page, std::uint32_t index) {
  if (index == 0) {
    return {&page.lane_state,   &page.context,          &page.backend,   &page.rank,
            &page.world_size,   &page.timeout_ms,       &page.queued,    &page.started,
            &page.finished,     &page.last_finished_ns, &page.failed,    &page.unrecorded,
            &page.p2p_since_ns, &page.p2p_op,           &page.p2p_bytes, &page.p2p_peer,
            page.collectives};
  }
  auto& lane = page.lanes[index - 1];
  auto& h = lane.header;
  return {&h.state,      &h.context,      &h.backend,      &h.rank,     &h.world_size,
          &h.timeout_ms, &h.queued,       &h.started,      &h.finished, &h.last_finished_ns,
          &h.failed,     &h.unrecorded,   &h.p2p_since_ns, &h.p2p_op,   &h.p2p_bytes,
          &h.p2p_peer,   lane.collectives};
}
// Lane `index` (< kCommunicatorLanes) of `page`.
inline Lane lane_of(RecordPage& page, std::uint32_t index) { return lane_in<Lane>(page, index); }
inline ConstLane lane_of(const RecordPage& page, std::uint32_t index) {
  return lane_in<ConstLane>(page, index);
}

}  // namespace ddp::record
