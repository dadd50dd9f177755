// libddprun-nccl-profiler.so: an NCCL profiler plugin that records a worker's NCCL collectives
// in ddprun's collective record page, so that any NCCL program (PyTorch without the probe's
// hooks, JAX, a C++ trainer not on libddp) gets ddprun's hang verdict and timeline. ddprun
// names it in NCCL_PROFILER_PLUGIN for its workers (launcher/process/nccl_profiler_lookup.*).
//
// What is recorded, for one communicator per process (the page holds one):
// - a collective (ncclProfileColl) or send/receive (ncclProfileP2p) is queued when NCCL
//   hands its kernel plan to the stream (startEvent);
// - it started when its kernel began work on its first channel (a ncclProfileKernelCh event
//   whose parent it is), and finished when the kernel ended on every channel and NCCL closed
//   the collective's own event (stopEvent: "enqueued"). NCCL 2.26+ (interface v3+) reports
//   kernel channels through its proxy thread; without them a collective's end is unknown,
//   which is why v1/v2 (NCCL 2.23-2.25) are not offered.
//
// Who writes the page: the first of libddp, the Python probe and this plugin to claim it
// (RecordPage::pid). They claim when the process's first communicator or process group is
// made; the plugin waits for its first collective, so that libddp (which attaches right after
// ncclCommInitRank) and the probe (at init_process_group) win when they are there, and the
// plugin stays passive: no double records. Of several communicators, the plugin takes the
// first to run a collective whose rank and size are the job's (RANK, WORLD_SIZE), or any when
// those are unset.
//
// Cost: not under ddprun (no DDPRUN_RECORD_FD), init asks NCCL for no events at all. Under
// ddprun, each event is a lock, a few stores into the page and a clock read; no allocation,
// no syscall, no output. One line on stderr at most, at the first init, when the page is
// unusable.

#include <pthread.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "ddp/common/record_page_writer.hpp"
#include "nccl_profiler_abi.hpp"

namespace ddp::nccl_profiler {
namespace {

using record::Op;

// The page's writer word for this plugin: pack_name keeps 8 characters ("nccl-profiler" does
// not fit).
inline constexpr const char* kWriterName = "ncclprof";

// One communicator's context (init's `context`).
struct Comm {
  int rank = -1;         // in the communicator; -1: not told (v3: taken from the first descriptor)
  int nranks = 0;        // 0: not told (v3)
  bool refused = false;  // not the page's communicator
};

// A followed collective or send/receive; its address is the handle NCCL keeps, and the parent
// of its kernel channels' events. Entries live as long as the plugin (never freed, so that a
// late event never touches freed memory) and are reused by issue order.
struct CollEvent {
  std::uint64_t order = 0;  // issue order among the followed events (1, 2, ...); 0: free
  std::uint64_t seq = 0;    // the page's collective number; 0: a send or recv (not numbered)
  unsigned expected = 0;    // kernel channels to wait for (0: unknown, any)
  unsigned seen = 0;        // kernel channels that started
  unsigned open = 0;        // events still open: its own and its channels'
  bool started = false;
  bool no_channels = false;  // NCCL gives it no channel events: done when its own event ends
  // A send or recv's, for the page's p2p words while it is the oldest not done.
  Op op = Op::kNone;
  std::uint64_t bytes = 0;
  std::uint64_t peer = record::kNoPeer;
  std::uint64_t queued_ns = 0;
};

inline constexpr std::uint64_t kEvents = 4 * record::kCollectiveSlots;
// A kernel channel's handle is its collective's, with the low bit set.
inline constexpr std::uintptr_t kChannelTag = 1;

struct Collective {
  Op op;
  std::uint64_t dtype;
  std::uint64_t count;
  std::uint64_t bytes;
};

Op op_of(std::string_view func) {
  if (func == "AllReduce") return Op::kAllReduce;
  if (func == "Broadcast") return Op::kBroadcast;
  if (func == "Reduce") return Op::kReduce;
  if (func == "AllGather") return Op::kAllGather;
  if (func == "ReduceScatter") return Op::kReduceScatter;
  if (func == "AlltoAll") return Op::kAllToAll;
  if (func == "Gather") return Op::kGather;
  if (func == "Scatter") return Op::kScatter;
  if (func == "Send") return Op::kSend;
  if (func == "Recv") return Op::kRecv;
  return Op::kOther;
}

struct DataType {
  std::string_view nccl;  // ncclDatatypeToString
  const char* name;       // the page's (PyTorch's where it fits in 8 characters)
  std::uint64_t size;
};
inline constexpr DataType kDataTypes[] = {
    {"ncclFloat32", "float32", 4},    {"ncclBfloat16", "bfloat16", 2},
    {"ncclFloat16", "float16", 2},    {"ncclFloat64", "float64", 8},
    {"ncclInt32", "int32", 4},        {"ncclInt64", "int64", 8},
    {"ncclInt8", "int8", 1},          {"ncclUint8", "uint8", 1},
    {"ncclUint32", "uint32", 4},      {"ncclUint64", "uint64", 8},
    {"ncclFloat8e4m3", "fp8e4m3", 1}, {"ncclFloat8e5m2", "fp8e5m2", 1},
};

Collective describe(const char* func, const char* datatype, std::size_t count) {
  Collective c{op_of(func ? func : ""), 0, count, 0};
  const std::string_view type = datatype ? datatype : "";
  for (const DataType& known : kDataTypes) {
    if (known.nccl == type) {
      c.dtype = record::pack_name(known.name);
      c.bytes = count * known.size;
    }
  }
  return c;
}

// True in a child forked after the plugin loaded (a data loader worker): the page is the
// parent's, and the lock may have been copied held, so the child records nothing.
std::atomic<bool> forked{false};

// The process's plugin: the page and the collectives in flight. One per process because the
// page is; reached only through the exported structs.
class Plugin {
 public:
  // The first init opens the page (or finds there is none); later ones reuse the answer.
  bool active() {
    std::call_once(opened_, [this] {
      job_rank_ = env_int("RANK");
      job_world_ = env_int("WORLD_SIZE");
      std::string problem;
      if (const auto fd = record::RecordPageWriter::fd_from_environment(problem)) {
        const std::string name = record::RecordPageWriter::descriptor_name(*fd);
        if (auto mapped = record::RecordPageWriter::map(*fd, name, "a ddprun", problem)) {
          writer_.emplace(std::move(*mapped));
        }
      }
      if (!problem.empty()) {
        std::fprintf(stderr,
                     "ddprun NCCL profiler: %s; NCCL collectives are not recorded (the hang "
                     "and straggler reports will not cover this rank)\n",
                     problem.c_str());
      }
    });
    return writer_.has_value();
  }

  // A collective or send/receive began (its task was handed to NCCL's stream); returns its
  // handle, nullptr when it is not followed. A send or recv is not numbered; no_channels: NCCL
  // will report no kernel channel for it (a send or recv to this rank itself, an empty part):
  // it is done when its own event ends.
  void* start_task(Comm& comm, int rank, const Collective& c, unsigned channels, bool p2p,
                   std::uint64_t peer, bool no_channels) {
    if (forked.load(std::memory_order_relaxed)) return nullptr;
    std::lock_guard lock(mutex_);
    if (comm.refused || !may_record(comm, rank)) return nullptr;
    const std::uint64_t order = ++issued_;
    const std::uint64_t seq =
        p2p ? 0 : writer_->on_queued(c.op, c.dtype, c.count, c.bytes, record::kNoBucket);
    CollEvent& event = events_[order % kEvents];
    // kEvents events in flight: this one is counted but not followed; it is done when a later
    // one is (done_through).
    if (event.order != 0) return nullptr;
    event = CollEvent{order, seq, channels, 0, 1, false, no_channels, c.op, c.bytes, peer, 0};
    if (p2p) {
      event.queued_ns = record::now_ns();
      if (p2p_open_ == 0) writer_->on_p2p(event.queued_ns, c.op, c.bytes, peer);
      ++p2p_open_;
    }
    return &event;
  }

  // A kernel channel of the collective `parent` began; returns its handle.
  void* start_channel(void* parent) {
    if (parent == nullptr || is_channel(parent) || !owns(parent)) return nullptr;
    if (forked.load(std::memory_order_relaxed)) return nullptr;
    std::lock_guard lock(mutex_);
    auto& event = *static_cast<CollEvent*>(parent);
    if (event.order == 0) return nullptr;
    if (!event.started) {
      event.started = true;
      if (event.seq != 0) writer_->on_started(event.seq);
    }
    ++event.seen;
    ++event.open;
    return reinterpret_cast<void*>(reinterpret_cast<std::uintptr_t>(parent) | kChannelTag);
  }

  // The communicator is being destroyed: the job's next one may take the page over.
  void forget(const Comm& comm) {
    if (forked.load(std::memory_order_relaxed)) return;
    std::lock_guard lock(mutex_);
    if (owner_ == &comm) owner_ = nullptr;
  }

  // A collective's own event or one of its channels' stopped.
  void stop(void* handle) {
    if (handle == nullptr || !owns(handle) || forked.load(std::memory_order_relaxed)) return;
    std::lock_guard lock(mutex_);
    auto& event =
        *reinterpret_cast<CollEvent*>(reinterpret_cast<std::uintptr_t>(handle) & ~kChannelTag);
    if (event.order == 0 || event.open == 0) return;
    --event.open;
    const bool every_channel =
        event.no_channels ||
        (event.seen > 0 && (event.expected == 0 || event.seen >= event.expected));
    if (event.open == 0 && every_channel) done_through(event.order);
  }

  // NCCL's activation mask (init's `eActivationMask`: NCCL reads it at every plan, so
  // setting it to 0 turns NCCL's profiler path off from then on).
  void watch_mask(int* mask) {
    std::lock_guard lock(mutex_);
    mask_ = mask;
  }

  // Whether this process's page belongs to another writer (libddp, the Python probe): then no
  // communicator here records, and NCCL need report nothing.
  bool page_elsewhere() {
    std::lock_guard lock(mutex_);
    if (claimed_) return false;
    const std::uint64_t owner = writer_->page().pid.load(std::memory_order_acquire);
    return owner != 0 && !ours(owner);
  }

 private:
  // Event `order` is done, and so is every earlier one still followed: a communicator's kernels
  // run in the order NCCL launched them, so one that never reports its end (NCCL has no proxy
  // work for it) is freed by the next that does. The mutex is held.
  void done_through(std::uint64_t order) {
    for (; oldest_ <= order; ++oldest_) {
      CollEvent& event = events_[oldest_ % kEvents];
      if (event.order != oldest_) continue;  // not followed, or done already
      if (event.seq != 0) {
        if (!event.started) writer_->on_started(event.seq);
        writer_->on_finished(event.seq, false);
      } else if (--p2p_open_ == 0) {
        writer_->on_p2p(0, Op::kNone, 0, record::kNoPeer);
      }
      event = CollEvent{};
    }
    // The oldest send or recv still open is the one the page names.
    if (p2p_open_ > 0) {
      for (std::uint64_t next = oldest_; next <= issued_; ++next) {
        const CollEvent& open = events_[next % kEvents];
        if (open.order == next && open.seq == 0) {
          writer_->on_p2p(open.queued_ns, open.op, open.bytes, open.peer);
          break;
        }
      }
    }
  }

  static bool is_channel(void* handle) {
    return (reinterpret_cast<std::uintptr_t>(handle) & kChannelTag) != 0;
  }
  // Whether a handle NCCL passes back is one of ours (a parent from another plugin instance or
  // process is never dereferenced).
  bool owns(void* handle) const {
    const auto address = reinterpret_cast<std::uintptr_t>(handle) & ~kChannelTag;
    const auto first = reinterpret_cast<std::uintptr_t>(&events_[0]);
    const auto last = reinterpret_cast<std::uintptr_t>(&events_[kEvents - 1]);
    return address >= first && address <= last && (address - first) % sizeof(CollEvent) == 0;
  }

  // Whether this communicator's collectives go on the page: it claims the page at its first
  // collective when it is the job's (or the job's size is unknown) and nobody has.
  bool may_record(Comm& comm, int descr_rank) {
    if (&comm == owner_) return true;
    if (owner_ != nullptr) {
      comm.refused = true;  // another communicator is the page's
      return false;
    }
    const int rank = comm.rank >= 0 ? comm.rank : descr_rank;
    const int world = comm.nranks > 0 ? comm.nranks : job_world_;
    // v3 tells no communicator size: a rank other than the job's is a subgroup's at least.
    if ((comm.nranks > 0 && job_world_ > 0 && comm.nranks != job_world_) ||
        (job_rank_ >= 0 && rank != job_rank_)) {
      comm.refused = true;  // a subgroup: wait for the job's communicator
      return false;
    }
    // (True again for the job's next communicator once the first was destroyed.)
    if (!claim(rank, world)) {
      comm.refused = true;  // libddp, the probe or another process records here:
      if (mask_ != nullptr) __atomic_store_n(mask_, 0, __ATOMIC_RELAXED);  // ask NCCL for none
      return false;
    }
    owner_ = &comm;
    return true;
  }

  // Takes the page for a communicator (rank of world_size) if no process has claimed it, and
  // publishes it, in lane 0; or takes it back from an earlier load of the plugin in this
  // process (NCCL unloads it with its last communicator), numbering on from its last
  // collective. False when libddp, the Python probe or another process owns it: they record
  // on their own. Once true, later calls return true. The mutex is held.
  bool claim(int rank, int world_size) {
    if (claimed_) return true;
    const std::uint64_t owner = writer_->claim_page();
    if (owner != 0 && !ours(owner)) return false;
    if (owner == 0) {
      writer_->write_header(static_cast<std::uint64_t>(rank < 0 ? 0 : rank),
                            static_cast<std::uint64_t>(world_size < 0 ? 0 : world_size));
      record::RecordPage& page = writer_->page();
      page.backend.store(record::pack_name("nccl"), std::memory_order_relaxed);
      page.writer.store(record::pack_name(kWriterName), std::memory_order_relaxed);
      // Lane 0 is this plugin's (version 2): a libddp communicator made later in this process
      // takes another lane instead of writing over it. The program's own NCCL timeout is not
      // known to a profiler: 0 (unknown).
      page.lane_state.store(static_cast<std::uint64_t>(record::LaneState::kOpen),
                            std::memory_order_relaxed);
    }
    writer_->use_lane(0);
    writer_->publish();  // nothing to do when an earlier load published it
    claimed_ = true;
    return true;
  }

  // Whether the page's owner `owner` is this process with this plugin's writer word.
  bool ours(std::uint64_t owner) const {
    return owner == record::RecordPageWriter::this_process() &&
           writer_->page().writer.load(std::memory_order_relaxed) == record::pack_name(kWriterName);
  }

  static int env_int(const char* name) {
    const char* value = std::getenv(name);
    return value != nullptr && *value != '\0' ? std::atoi(value) : -1;
  }

  std::once_flag opened_;
  std::optional<record::RecordPageWriter> writer_;  // none: no page, the plugin does nothing
  bool claimed_ = false;         // the page is this plugin's (lane 0): claim() returned true
  int job_rank_ = -1;            // RANK and WORLD_SIZE, read once at the first init (not on
  int job_world_ = -1;           // NCCL's threads, where a program may be writing environ)
  std::mutex mutex_;             // every page write and event below
  const Comm* owner_ = nullptr;  // the communicator whose collectives are recorded
  std::uint64_t issued_ = 0;     // events followed or counted, in issue order
  std::uint64_t oldest_ = 1;     // every event before it is done
  std::uint64_t p2p_open_ = 0;   // sends and receives followed and not done
  int* mask_ = nullptr;          // NCCL's activation mask, once an init gave it
  CollEvent events_[kEvents];
};

// Never destroyed: NCCL's proxy threads may still call in while the process exits (a program
// that never destroys its communicators), after static destructors ran. It lives in static
// storage, so nothing leaks when NCCL unloads the plugin (with its last communicator; the page
// stays mapped); a reload makes a new one, which takes the page back (Plugin::claim).
Plugin& plugin() {
  alignas(Plugin) static unsigned char storage[sizeof(Plugin)];
  static Plugin* instance = [] {
    pthread_atfork(nullptr, nullptr, [] { forked.store(true, std::memory_order_relaxed); });
    return new (storage) Plugin;
  }();
  return *instance;
}

// --- The interface, per version ------------------------------------------------------------

// Every group event's handle: not followed (stopEvent ignores it), but not null, since NCCL
// 2.26 and 2.27 start a plan's collective events only when its group event has a handle.
char group_event;

// The events asked for: collectives, sends/receives, and kernel channels (their ends). NCCL
// starts a group event (type kProfileGroup) around each kernel plan for any of them.
constexpr int kMask = static_cast<int>(kProfileColl | kProfileP2p | kProfileKernelCh);

// Every entry point NCCL calls: an exception (bad_alloc, a lock's system_error) never leaves
// the plugin into NCCL's C code; the event is then not recorded.
template <typename F>
Result guarded(F&& body) noexcept {
  try {
    body();
  } catch (...) {
  }
  return kSuccess;
}

// NCCL's cost of asking for events falls on every communicator: proxy connections per
// channel, a proxy operation per channel per collective, a host function in every CUDA-graph
// plan. So the mask is 0 wherever the plugin will not record: no page (not under ddprun), or
// a page another writer owns (libddp, the Python probe); and it is set to 0 as soon as the
// page turns out to be another's.
Result init_comm(void** context, int* mask, int nranks, int rank) {
  *context = nullptr;
  *mask = 0;
  return guarded([&] {
    Plugin& p = plugin();
    if (!p.active() || p.page_elsewhere()) return;
    auto* comm = new (std::nothrow) Comm{rank, nranks, false};
    if (comm == nullptr) return;
    p.watch_mask(mask);
    *context = comm;
    *mask = kMask;
  });
}

Result finalize(void* context) {
  // A communicator's recorded collectives stay on the page; only its context goes. (The page
  // keeps naming this communicator's last collectives, as libddp's does after destroy.)
  if (context == nullptr) return kSuccess;
  auto* comm = static_cast<Comm*>(context);
  guarded([&] { plugin().forget(*comm); });
  delete comm;
  return kSuccess;
}

Result stop_event(void* handle) {
  return guarded([&] { plugin().stop(handle); });
}

Result record_event_state(void*, int, EventStateArgs*) { return kSuccess; }

// startEvent for any descriptor version: Descr is EventDescrV3, V4 or V5 (same member names).
// kCountsChannels: the descriptor says on how many channels the kernel runs (v4+; v3's
// nMaxChannels only bounds them, so a v3 collective waits for the channels that started).
template <bool kCountsChannels, typename Descr>
Result start_event(void* context, void** handle, Descr* descr) {
  *handle = nullptr;
  if (context == nullptr || descr == nullptr) return kSuccess;
  return guarded([&] {
    auto& comm = *static_cast<Comm*>(context);
    const auto type = static_cast<std::uint64_t>(descr->type);
    if (type == kProfileColl) {
      unsigned channels = 0;
      if constexpr (kCountsChannels) channels = descr->coll.nChannels;
      *handle = plugin().start_task(
          comm, descr->rank, describe(descr->coll.func, descr->coll.datatype, descr->coll.count),
          channels, false, record::kNoPeer, false);
    } else if (type == kProfileP2p) {
      unsigned channels = 0;
      if constexpr (kCountsChannels) channels = descr->p2p.nChannels;
      // NCCL gives a send or recv to this rank itself no proxy work, nor an empty part (after
      // its rounding): no kernel channel event will come for those.
      const bool self = descr->p2p.peer == descr->rank;
      const bool no_channels = self || descr->p2p.count == 0 || (kCountsChannels && channels == 0);
      const std::uint64_t peer =
          descr->p2p.peer >= 0 ? static_cast<std::uint64_t>(descr->p2p.peer) : record::kNoPeer;
      *handle = plugin().start_task(
          comm, descr->rank, describe(descr->p2p.func, descr->p2p.datatype, descr->p2p.count),
          channels, true, peer, no_channels);
    } else if (type == kProfileKernelCh) {
      *handle = plugin().start_channel(descr->parentObj);
    } else if (type == kProfileGroup) {
      // NCCL 2.26 and 2.27 report a plan's collectives only under a group event with a handle.
      *handle = &group_event;
    }
  });
}

Result init_v3(void** context, int* mask) { return init_comm(context, mask, 0, -1); }
Result start_v3(void* context, void** handle, EventDescrV3* descr) {
  return start_event<false>(context, handle, descr);
}

Result init_v4(void** context, int* mask, const char*, std::uint64_t, int, int nranks, int rank,
               DebugLogger) {
  return init_comm(context, mask, nranks, rank);
}
Result start_v4(void* context, void** handle, EventDescrV4* descr) {
  return start_event<true>(context, handle, descr);
}

Result init_v5(void** context, std::uint64_t, int* mask, const char*, int, int nranks, int rank,
               DebugLogger) {
  return init_comm(context, mask, nranks, rank);
}
Result start_v5(void* context, void** handle, EventDescrV5* descr) {
  return start_event<true>(context, handle, descr);
}

}  // namespace
}  // namespace ddp::nccl_profiler

// The symbols NCCL looks up, newest first (nccl_profiler_abi.hpp). Everything else in the
// library is hidden (-fvisibility=hidden).
extern "C" {
using namespace ddp::nccl_profiler;
__attribute__((visibility("default"))) ProfilerV5 ncclProfiler_v6 = {
    kPluginName, init_v5, start_v5, stop_event, record_event_state, finalize};
__attribute__((visibility("default"))) ProfilerV5 ncclProfiler_v5 = {
    kPluginName, init_v5, start_v5, stop_event, record_event_state, finalize};
__attribute__((visibility("default"))) ProfilerV4 ncclProfiler_v4 = {
    kPluginName, init_v4, start_v4, stop_event, record_event_state, finalize};
__attribute__((visibility("default"))) ProfilerV3 ncclProfiler_v3 = {
    kPluginName, init_v3, start_v3, stop_event, record_event_state, finalize};
}
