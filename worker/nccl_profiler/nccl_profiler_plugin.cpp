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

#include "nccl_profiler_abi.hpp"
#include "page_writer.hpp"

namespace ddp::nccl_profiler {
namespace {

using record::Op;

// One communicator's context (init's `context`).
struct Comm {
  int rank = -1;         // in the communicator; -1: not told (v3: taken from the first descriptor)
  int nranks = 0;        // 0: not told (v3)
  bool refused = false;  // not the page's communicator
};

// A recorded collective; its address is the handle NCCL keeps, and the parent of its kernel
// channels' events. Entries live as long as the plugin (never freed, so that a late event
// never touches freed memory) and are reused by number, like the page's slots.
struct CollEvent {
  std::uint64_t seq = 0;  // page number; 0: free
  unsigned expected = 0;  // kernel channels to wait for (0: unknown, any)
  unsigned seen = 0;      // kernel channels that started
  unsigned open = 0;      // events still open: the collective's own and its channels'
  bool started = false;
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
      std::string problem;
      if (auto opened = PageWriter::open_from_environment(problem)) {
        writer_.emplace(std::move(*opened));
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

  // A collective or p2p began; returns its handle, nullptr when it is not recorded.
  void* start_collective(Comm& comm, int rank, const Collective& c, unsigned channels) {
    if (forked.load(std::memory_order_relaxed)) return nullptr;
    std::lock_guard lock(mutex_);
    if (comm.refused || !may_record(comm, rank)) return nullptr;
    const std::uint64_t seq = writer_->on_queued(c.op, c.dtype, c.count, c.bytes);
    CollEvent& event = events_[seq % kEvents];
    // kEvents collectives in flight: this one is counted but not followed; `finished` passes
    // it when a later one finishes.
    if (event.seq != 0) return nullptr;
    event = CollEvent{seq, channels, 0, 1, false};
    return &event;
  }

  // A kernel channel of the collective `parent` began; returns its handle.
  void* start_channel(void* parent) {
    if (parent == nullptr || is_channel(parent) || !owns(parent)) return nullptr;
    if (forked.load(std::memory_order_relaxed)) return nullptr;
    std::lock_guard lock(mutex_);
    auto& event = *static_cast<CollEvent*>(parent);
    if (event.seq == 0) return nullptr;
    if (!event.started) {
      event.started = true;
      writer_->on_started(event.seq);
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
    if (event.seq == 0 || event.open == 0) return;
    --event.open;
    const bool every_channel =
        event.seen > 0 && (event.expected == 0 || event.seen >= event.expected);
    if (event.open == 0 && every_channel) {
      writer_->on_finished(event.seq);
      event = CollEvent{};
    }
  }

 private:
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
    const int world = comm.nranks > 0 ? comm.nranks : env_int("WORLD_SIZE");
    const int job_rank = env_int("RANK");
    const int job_world = env_int("WORLD_SIZE");
    if (comm.nranks > 0 && job_world > 0 && (comm.nranks != job_world || rank != job_rank)) {
      comm.refused = true;  // a subgroup: wait for the job's communicator
      return false;
    }
    // (True again for the job's next communicator once the first was destroyed.)
    if (!writer_->claim(rank, world)) {
      comm.refused = true;  // libddp, the probe or another process records here
      return false;
    }
    owner_ = &comm;
    return true;
  }

  static int env_int(const char* name) {
    const char* value = std::getenv(name);
    return value != nullptr && *value != '\0' ? std::atoi(value) : -1;
  }

  std::once_flag opened_;
  std::optional<PageWriter> writer_;  // none: no page, the plugin does nothing
  std::mutex mutex_;                  // every page write and event below
  const Comm* owner_ = nullptr;       // the communicator whose collectives are recorded
  CollEvent events_[kEvents];
};

// Never destroyed: NCCL's proxy threads may still call in while the process exits (a program
// that never destroys its communicators), after static destructors ran. It lives in static
// storage, so nothing leaks when NCCL unloads the plugin (with its last communicator; the page
// stays mapped); a reload makes a new one, which takes the page back (PageWriter::claim).
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

Result init_comm(void** context, int* mask, int nranks, int rank) {
  *context = nullptr;
  *mask = 0;
  if (!plugin().active()) return kSuccess;
  auto* comm = new (std::nothrow) Comm{rank, nranks, false};
  if (comm == nullptr) return kSuccess;
  *context = comm;
  *mask = kMask;
  return kSuccess;
}

Result finalize(void* context) {
  // A communicator's recorded collectives stay on the page; only its context goes. (The page
  // keeps naming this communicator's last collectives, as libddp's does after destroy.)
  if (context == nullptr) return kSuccess;
  auto* comm = static_cast<Comm*>(context);
  plugin().forget(*comm);
  delete comm;
  return kSuccess;
}

Result stop_event(void* handle) {
  plugin().stop(handle);
  return kSuccess;
}

Result record_event_state(void*, int, EventStateArgs*) { return kSuccess; }

// startEvent for any descriptor version: Descr is EventDescrV3, V4 or V5 (same member names).
// kCountsChannels: the descriptor says on how many channels the kernel runs (v4+; v3's
// nMaxChannels only bounds them, so a v3 collective waits for the channels that started).
template <bool kCountsChannels, typename Descr>
Result start_event(void* context, void** handle, Descr* descr) {
  *handle = nullptr;
  if (context == nullptr || descr == nullptr) return kSuccess;
  auto& comm = *static_cast<Comm*>(context);
  const auto type = static_cast<std::uint64_t>(descr->type);
  if (type == kProfileColl) {
    unsigned channels = 0;
    if constexpr (kCountsChannels) channels = descr->coll.nChannels;
    *handle = plugin().start_collective(
        comm, descr->rank, describe(descr->coll.func, descr->coll.datatype, descr->coll.count),
        channels);
  } else if (type == kProfileP2p) {
    unsigned channels = 0;
    if constexpr (kCountsChannels) channels = descr->p2p.nChannels;
    *handle = plugin().start_collective(
        comm, descr->rank, describe(descr->p2p.func, descr->p2p.datatype, descr->p2p.count),
        channels);
  } else if (type == kProfileKernelCh) {
    *handle = plugin().start_channel(descr->parentObj);
  } else if (type == kProfileGroup) {
    // NCCL 2.26 and 2.27 report a plan's collectives only under a group event with a handle.
    *handle = &group_event;
  }
  return kSuccess;
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
