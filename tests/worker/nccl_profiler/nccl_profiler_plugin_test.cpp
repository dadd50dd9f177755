// libddprun-nccl-profiler.so driven through NCCL's profiler interface as NCCL drives it: the
// test dlopens the built plugin, looks up the exported ncclProfiler_v<N> structs, calls init
// with a communicator's context, then for each collective startEvent/stopEvent of its
// ncclProfileColl event on one thread (NCCL's host-stream task) and startEvent,
// recordEventState(KernelChStop), stopEvent of its kernel channels' events on another (NCCL's
// proxy thread), and reads the record page back as the agent does. The page is made as ddprun
// makes it (RecordMapping) and named in DDPRUN_RECORD_FD.
#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ddp/common/collective_record.hpp"
#include "ddp/common/worker_contract.hpp"
#include "nccl_profiler/nccl_profiler_abi.hpp"
#include "process/record_mapping.hpp"

using namespace ddp::record;
using namespace ddp::nccl_profiler;

namespace {

// The plugin, freshly loaded (its process-wide state starts anew), unloaded at the end.
class LoadedPlugin {
 public:
  LoadedPlugin() : handle_(dlopen(DDP_NCCL_PROFILER_PATH, RTLD_NOW | RTLD_LOCAL)) {
    INFO(DDP_NCCL_PROFILER_PATH << ": " << (handle_ ? "" : dlerror()));
    REQUIRE(handle_ != nullptr);
  }
  ~LoadedPlugin() { dlclose(handle_); }
  template <typename T>
  T& get(const char* symbol) {
    void* found = dlsym(handle_, symbol);
    INFO(symbol);
    REQUIRE(found != nullptr);
    return *static_cast<T*>(found);
  }

 private:
  void* handle_;
};

// The worker's environment under ddprun: the page, and the job's rank and size.
class WorkerEnvironment {
 public:
  WorkerEnvironment(const ddp::launcher::RecordMapping* page, int rank, int world_size) {
    if (page) {
      setenv(ddp::contract::kRecordFd, std::to_string(page->fd()).c_str(), 1);
    } else {
      unsetenv(ddp::contract::kRecordFd);
    }
    setenv("RANK", std::to_string(rank).c_str(), 1);
    setenv("WORLD_SIZE", std::to_string(world_size).c_str(), 1);
  }
  ~WorkerEnvironment() {
    unsetenv(ddp::contract::kRecordFd);
    unsetenv("RANK");
    unsetenv("WORLD_SIZE");
  }
};

struct Expected {
  const char* func;
  const char* datatype;
  std::size_t count;
  Op op;
  const char* dtype;
  std::uint64_t bytes;
};

const std::vector<Expected> kCollectives = {
    {"AllReduce", "ncclFloat32", 1000, Op::kAllReduce, "float32", 4000},
    {"Broadcast", "ncclBfloat16", 10, Op::kBroadcast, "bfloat16", 20},
    {"AllGather", "ncclInt64", 3, Op::kAllGather, "int64", 24},
    {"ReduceScatter", "ncclFloat16", 8, Op::kReduceScatter, "float16", 16},
    {"Reduce", "ncclFloat64", 2, Op::kReduce, "float64", 16},
    {"Send", "ncclInt8", 5, Op::kSend, "int8", 5},
    {"Recv", "ncclInt8", 5, Op::kRecv, "int8", 5},
    {"PutSignal", "ncclUint8", 7, Op::kOther, "uint8", 7},
};

bool is_p2p(const Expected& e) {
  return std::string(e.func) == "Send" || std::string(e.func) == "Recv";
}

// Work NCCL's proxy thread does: kernel channel events for a collective's handle. (Catch's
// assertions are for the main thread: the threads count what went wrong in `errors`.)
class ProxyThread {
 public:
  std::atomic<int> errors{0};
  explicit ProxyThread(const ProfilerV5& plugin, void* context)
      : thread_([this, &plugin, context] { run(plugin, context); }) {}
  ~ProxyThread() { stop(); }
  void stop() {
    {
      std::lock_guard lock(mutex_);
      done_ = true;
    }
    ready_.notify_one();
    if (thread_.joinable()) thread_.join();
  }
  void post(void* collective, int channels) {
    {
      std::lock_guard lock(mutex_);
      work_.push_back({collective, channels});
    }
    ready_.notify_one();
  }

 private:
  void run(const ProfilerV5& plugin, void* context) {
    for (;;) {
      std::unique_lock lock(mutex_);
      ready_.wait(lock, [&] { return done_ || !work_.empty(); });
      if (work_.empty()) return;
      auto [collective, channels] = work_.front();
      work_.pop_front();
      lock.unlock();
      std::vector<void*> handles;
      for (int c = 0; c < channels; ++c) {
        EventDescrV5 descr{};
        descr.type = kProfileKernelCh;
        descr.parentObj = collective;
        descr.kernelCh.channelId = static_cast<std::uint8_t>(c);
        void* handle = nullptr;
        if (plugin.startEvent(context, &handle, &descr) != kSuccess || handle == nullptr) ++errors;
        handles.push_back(handle);
      }
      for (void* handle : handles) {
        EventStateArgs args{};
        if (plugin.recordEventState(handle, kStateKernelChStop, &args) != kSuccess) ++errors;
        if (plugin.stopEvent(handle) != kSuccess) ++errors;
      }
    }
  }

  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::pair<void*, int>> work_;
  bool done_ = false;
  std::thread thread_;
};

EventDescrV5 descr_v5(const Expected& e, int rank, std::uint64_t seq, std::uint8_t channels) {
  EventDescrV5 descr{};
  descr.rank = rank;
  if (is_p2p(e)) {
    descr.type = kProfileP2p;
    descr.p2p.func = e.func;
    descr.p2p.datatype = e.datatype;
    descr.p2p.count = e.count;
    descr.p2p.peer = 1 - rank;
    descr.p2p.nChannels = channels;
  } else {
    descr.type = kProfileColl;
    descr.coll.seqNumber = seq;
    descr.coll.func = e.func;
    descr.coll.datatype = e.datatype;
    descr.coll.count = e.count;
    descr.coll.nChannels = channels;
  }
  return descr;
}

// Rank 0 of a job of 2 under ddprun (its page and environment), the plugin loaded and its
// communicator made through interface v5, as most cases start.
struct RankZeroOfTwo {
  ddp::launcher::RecordMapping mapping;
  WorkerEnvironment env{&mapping, 0, 2};
  LoadedPlugin loaded;
  const ProfilerV5& plugin = loaded.get<ProfilerV5>(kSymbolV5);
  void* context = nullptr;
  int mask = 0;  // NCCL's activation mask, which the plugin may change later
  RankZeroOfTwo() { REQUIRE(plugin.init(&context, 1, &mask, "job", 1, 2, 0, nullptr) == kSuccess); }
};

struct Slot {
  std::uint64_t seq, op, dtype, count, bytes, queued_ns, started_ns, finished_ns;
};

Slot slot_of(const RecordPage& page, std::uint64_t seq) {
  Slot s{};
  const bool stable = read_stable(page.collectives[seq % kCollectiveSlots], [&](const auto& c) {
    s = {c.seq.load(),   c.op.load(),        c.dtype.load(),      c.count.load(),
         c.bytes.load(), c.queued_ns.load(), c.started_ns.load(), c.finished_ns.load()};
  });
  REQUIRE(stable);
  return s;
}

}  // namespace

TEST_CASE("nccl profiler: exports interface v3 to v6, named ddprun") {
  LoadedPlugin plugin;
  CHECK(std::string(plugin.get<ProfilerV3>(kSymbolV3).name) == kPluginName);
  CHECK(std::string(plugin.get<ProfilerV4>(kSymbolV4).name) == kPluginName);
  CHECK(std::string(plugin.get<ProfilerV5>(kSymbolV5).name) == kPluginName);
  CHECK(std::string(plugin.get<ProfilerV5>(kSymbolV6).name) == kPluginName);
}

TEST_CASE(
    "nccl profiler: every collective is recorded with its op, type, count and number, "
    "started and finished by the kernel events of another thread") {
  ddp::launcher::RecordMapping mapping;
  WorkerEnvironment env(&mapping, 1, 2);
  LoadedPlugin loaded;
  const auto& plugin = loaded.get<ProfilerV5>(kSymbolV5);
  void* context = nullptr;
  int mask = 0;
  REQUIRE(plugin.init(&context, 0x1234, &mask, "job", 1, 2, 1, nullptr) == kSuccess);
  REQUIRE(context != nullptr);
  CHECK((mask & kProfileColl) != 0);
  CHECK((mask & kProfileP2p) != 0);
  CHECK((mask & kProfileKernelCh) != 0);

  constexpr int kRounds = 40;  // 320 collectives: the page's 256 slots wrap
  std::atomic<int> host_errors{0};
  std::atomic<int> proxy_errors{0};
  {
    ProxyThread proxy(plugin, context);
    // NCCL's host-stream task: starts a plan's collectives, uploads their proxy work (the
    // kernel events may come before the collective's own stop), then stops them.
    std::thread host([&] {
      for (int round = 0; round < kRounds; ++round) {
        for (std::size_t i = 0; i < kCollectives.size(); ++i) {
          // At most half the page in flight, so that every slot is written (a slot whose
          // collective has not finished is not reused).
          const std::uint64_t issued = round * kCollectives.size() + i;  // sends too
          while (issued >= mapping.page().finished.load() + kCollectiveSlots / 2) {
            std::this_thread::yield();
          }
          const std::uint8_t channels = static_cast<std::uint8_t>(1 + i % 3);
          EventDescrV5 descr = descr_v5(kCollectives[i], 1, round, channels);
          void* handle = nullptr;
          if (plugin.startEvent(context, &handle, &descr) != kSuccess || handle == nullptr) {
            ++host_errors;
            return;
          }
          proxy.post(handle, channels);
          if (plugin.stopEvent(handle) != kSuccess) ++host_errors;
        }
      }
    });
    host.join();
    proxy.stop();  // drains its work
    proxy_errors = proxy.errors.load();
  }
  REQUIRE(host_errors == 0);
  REQUIRE(proxy_errors == 0);

  const RecordPage& page = mapping.page();
  REQUIRE(page.magic.load() == kRecordMagic);
  CHECK(page.pid.load() == static_cast<std::uint64_t>(getpid()));
  CHECK(page.rank.load() == 1);
  CHECK(page.world_size.load() == 2);
  CHECK(unpack_name(page.backend.load()) == "nccl");
  CHECK(unpack_name(page.writer.load()) == "ncclprof");
  // Sends and receives are not numbered (issue 28: ranks send and receive unevenly, which
  // would set their collective numbers apart); every other one is.
  std::vector<Expected> numbered;
  for (const Expected& e : kCollectives) {
    if (!is_p2p(e)) numbered.push_back(e);
  }
  const std::uint64_t total = kRounds * numbered.size();
  CHECK(page.queued.load() == total);
  CHECK(page.started.load() == total);
  CHECK(page.finished.load() == total);
  CHECK(page.p2p_since_ns.load() == 0);  // every send and recv done
  // The last kCollectiveSlots collectives are on the page, each with its own slot.
  for (std::uint64_t seq = total - kCollectiveSlots + 1; seq <= total; ++seq) {
    const Expected& e = numbered[(seq - 1) % numbered.size()];
    const Slot s = slot_of(page, seq);
    INFO("collective " << seq << " (" << e.func << ")");
    CHECK(s.seq == seq);
    CHECK(s.op == static_cast<std::uint64_t>(e.op));
    CHECK(unpack_name(s.dtype) == e.dtype);
    CHECK(s.count == e.count);
    CHECK(s.bytes == e.bytes);
    CHECK(s.queued_ns != 0);
    CHECK(s.started_ns >= s.queued_ns);
    CHECK(s.finished_ns >= s.started_ns);
  }
  REQUIRE(plugin.finalize(context) == kSuccess);
}

TEST_CASE(
    "nccl profiler: a collective starts with its kernel and finishes only when every "
    "channel and its own event ended") {
  RankZeroOfTwo job;
  [[maybe_unused]] auto& [mapping, env, loaded, plugin, context, mask] = job;
  const RecordPage& page = mapping.page();

  EventDescrV5 coll = descr_v5(kCollectives[0], 0, 0, 2);
  void* handle = nullptr;
  REQUIRE(plugin.startEvent(context, &handle, &coll) == kSuccess);
  REQUIRE(plugin.stopEvent(handle) == kSuccess);  // enqueued: not yet running
  CHECK(page.queued.load() == 1);
  CHECK(page.started.load() == 0);
  CHECK(slot_of(page, 1).started_ns == 0);

  auto channel = [&](std::uint8_t id) {
    EventDescrV5 descr{};
    descr.type = kProfileKernelCh;
    descr.parentObj = handle;
    descr.kernelCh.channelId = id;
    void* channel_handle = nullptr;
    REQUIRE(plugin.startEvent(context, &channel_handle, &descr) == kSuccess);
    REQUIRE(channel_handle != nullptr);
    return channel_handle;
  };
  void* first = channel(0);
  CHECK(page.started.load() == 1);
  CHECK(slot_of(page, 1).started_ns != 0);
  REQUIRE(plugin.stopEvent(first) == kSuccess);
  CHECK(page.finished.load() == 0);  // the second channel has not run
  void* second = channel(1);
  CHECK(page.finished.load() == 0);
  REQUIRE(plugin.stopEvent(second) == kSuccess);
  CHECK(page.finished.load() == 1);
  CHECK(slot_of(page, 1).finished_ns != 0);
  CHECK(page.failed.load() == 0);
  REQUIRE(plugin.finalize(context) == kSuccess);
}

TEST_CASE("nccl profiler: interface v4 and v3 record as v5 does") {
  SECTION("v4") {
    ddp::launcher::RecordMapping mapping;
    WorkerEnvironment env(&mapping, 0, 2);
    LoadedPlugin loaded;
    const auto& plugin = loaded.get<ProfilerV4>(kSymbolV4);
    void* context = nullptr;
    int mask = 0;
    REQUIRE(plugin.init(&context, &mask, "job", 7, 1, 2, 0, nullptr) == kSuccess);
    CHECK((mask & kProfileKernelCh) != 0);
    // NCCL 2.27 starts a plan's collectives only under a group event that got a handle.
    EventDescrV4 group{};
    group.type = kProfileGroup;
    void* group_handle = nullptr;
    REQUIRE(plugin.startEvent(context, &group_handle, &group) == kSuccess);
    REQUIRE(group_handle != nullptr);
    EventDescrV4 descr{};
    descr.parentObj = group_handle;
    descr.type = kProfileColl;
    descr.coll.seqNumber = 0;
    descr.coll.func = "AllGather";
    descr.coll.datatype = "ncclInt32";
    descr.coll.count = 6;
    descr.coll.nChannels = 1;
    void* handle = nullptr;
    REQUIRE(plugin.startEvent(context, &handle, &descr) == kSuccess);
    EventDescrV4 channel{};
    channel.type = kProfileKernelCh;
    channel.parentObj = handle;
    void* channel_handle = nullptr;
    REQUIRE(plugin.startEvent(context, &channel_handle, &channel) == kSuccess);
    REQUIRE(plugin.stopEvent(handle) == kSuccess);
    REQUIRE(plugin.stopEvent(channel_handle) == kSuccess);
    REQUIRE(plugin.stopEvent(group_handle) == kSuccess);
    const Slot s = slot_of(mapping.page(), 1);
    CHECK(s.op == static_cast<std::uint64_t>(Op::kAllGather));
    CHECK(unpack_name(s.dtype) == "int32");
    CHECK(s.bytes == 24);
    CHECK(mapping.page().finished.load() == 1);
    REQUIRE(plugin.finalize(context) == kSuccess);
  }
  SECTION("v3: rank from the descriptor, size from WORLD_SIZE") {
    ddp::launcher::RecordMapping mapping;
    WorkerEnvironment env(&mapping, 3, 4);
    LoadedPlugin loaded;
    const auto& plugin = loaded.get<ProfilerV3>(kSymbolV3);
    void* context = nullptr;
    int mask = 0;
    // Issue 28: a subgroup's communicator, whose first collective comes first, once claimed
    // the page with its own rank (1 of 2) as the job's.
    void* subgroup = nullptr;
    REQUIRE(plugin.init(&subgroup, &mask) == kSuccess);
    EventDescrV3 sub{};
    sub.type = kProfileColl;
    sub.rank = 1;
    sub.coll.func = "AllReduce";
    sub.coll.datatype = "ncclFloat32";
    sub.coll.count = 4;
    void* sub_handle = nullptr;
    REQUIRE(plugin.startEvent(subgroup, &sub_handle, &sub) == kSuccess);
    CHECK(sub_handle == nullptr);
    CHECK(mapping.page().magic.load() == 0);
    REQUIRE(plugin.init(&context, &mask) == kSuccess);
    EventDescrV3 descr{};
    descr.type = kProfileColl;
    descr.rank = 3;
    descr.coll.func = "Broadcast";
    descr.coll.datatype = "ncclFloat32";
    descr.coll.count = 100;
    descr.coll.nMaxChannels = 32;  // an upper bound only: not waited for
    void* handle = nullptr;
    REQUIRE(plugin.startEvent(context, &handle, &descr) == kSuccess);
    REQUIRE(plugin.stopEvent(handle) == kSuccess);
    EventDescrV3 channel{};
    channel.type = kProfileKernelCh;
    channel.parentObj = handle;
    void* channel_handle = nullptr;
    REQUIRE(plugin.startEvent(context, &channel_handle, &channel) == kSuccess);
    REQUIRE(plugin.stopEvent(channel_handle) == kSuccess);
    const RecordPage& page = mapping.page();
    CHECK(page.rank.load() == 3);
    CHECK(page.world_size.load() == 4);
    CHECK(page.finished.load() == 1);
    CHECK(slot_of(page, 1).op == static_cast<std::uint64_t>(Op::kBroadcast));
    REQUIRE(plugin.finalize(context) == kSuccess);
    REQUIRE(plugin.finalize(subgroup) == kSuccess);
  }
}

TEST_CASE("nccl profiler: without a page init asks for no events and nothing happens") {
  WorkerEnvironment env(nullptr, 0, 2);
  LoadedPlugin loaded;
  const auto& plugin = loaded.get<ProfilerV5>(kSymbolV5);
  void* context = reinterpret_cast<void*>(1);
  int mask = -1;
  REQUIRE(plugin.init(&context, 1, &mask, "job", 1, 2, 0, nullptr) == kSuccess);
  CHECK(mask == 0);
  CHECK(context == nullptr);
  EventDescrV5 descr = descr_v5(kCollectives[0], 0, 0, 1);
  void* handle = reinterpret_cast<void*>(1);
  REQUIRE(plugin.startEvent(context, &handle, &descr) == kSuccess);
  CHECK(handle == nullptr);
  REQUIRE(plugin.stopEvent(handle) == kSuccess);
  REQUIRE(plugin.finalize(context) == kSuccess);
}

TEST_CASE("nccl profiler: a page libddp or the Python probe claimed is left to them") {
  ddp::launcher::RecordMapping mapping;
  WorkerEnvironment env(&mapping, 0, 2);
  // The other writer claims the page as they do: pid from 0 to ours, at their first group.
  void* words =
      mmap(nullptr, sizeof(RecordPage), PROT_READ | PROT_WRITE, MAP_SHARED, mapping.fd(), 0);
  REQUIRE(words != MAP_FAILED);
  auto& writable = *static_cast<RecordPage*>(words);
  writable.pid.store(static_cast<std::uint64_t>(getpid()));
  writable.writer.store(pack_name("torch"));
  LoadedPlugin loaded;
  const auto& plugin = loaded.get<ProfilerV5>(kSymbolV5);
  void* context = nullptr;
  int mask = -1;
  REQUIRE(plugin.init(&context, 1, &mask, "job", 1, 2, 0, nullptr) == kSuccess);
  // Issue 28: asking NCCL for events turns on its profiler path in every communicator (proxy
  // work per channel, per collective): not for a page the plugin will not write.
  CHECK(mask == 0);
  EventDescrV5 descr = descr_v5(kCollectives[0], 0, 0, 1);
  void* handle = nullptr;
  REQUIRE(plugin.startEvent(context, &handle, &descr) == kSuccess);
  CHECK(handle == nullptr);
  const RecordPage& page = mapping.page();
  CHECK(page.queued.load() == 0);
  CHECK(unpack_name(page.writer.load()) == "torch");
  CHECK(page.magic.load() == 0);
  REQUIRE(plugin.finalize(context) == kSuccess);
  munmap(words, sizeof(RecordPage));
}

TEST_CASE("nccl profiler: of several communicators, the job's is recorded, not a subgroup") {
  ddp::launcher::RecordMapping mapping;
  WorkerEnvironment env(&mapping, 2, 4);
  LoadedPlugin loaded;
  const auto& plugin = loaded.get<ProfilerV5>(kSymbolV5);
  void* subgroup = nullptr;
  void* world = nullptr;
  int mask = 0;
  REQUIRE(plugin.init(&subgroup, 1, &mask, "sub", 1, 2, 0, nullptr) == kSuccess);
  REQUIRE(plugin.init(&world, 2, &mask, "world", 1, 4, 2, nullptr) == kSuccess);
  EventDescrV5 descr = descr_v5(kCollectives[0], 0, 0, 1);
  void* handle = nullptr;
  REQUIRE(plugin.startEvent(subgroup, &handle, &descr) == kSuccess);
  CHECK(handle == nullptr);
  descr.rank = 2;
  REQUIRE(plugin.startEvent(world, &handle, &descr) == kSuccess);
  CHECK(handle != nullptr);
  REQUIRE(plugin.stopEvent(handle) == kSuccess);
  const RecordPage& page = mapping.page();
  CHECK(page.queued.load() == 1);
  CHECK(page.rank.load() == 2);
  CHECK(page.world_size.load() == 4);
  REQUIRE(plugin.finalize(subgroup) == kSuccess);
  REQUIRE(plugin.finalize(world) == kSuccess);
}

TEST_CASE(
    "nccl profiler: loaded again (NCCL unloads it with its last communicator), it "
    "numbers on where it stopped") {
  ddp::launcher::RecordMapping mapping;
  WorkerEnvironment env(&mapping, 0, 2);
  for (int load = 0; load < 2; ++load) {
    LoadedPlugin loaded;
    const auto& plugin = loaded.get<ProfilerV5>(kSymbolV5);
    void* context = nullptr;
    int mask = 0;
    REQUIRE(plugin.init(&context, 1, &mask, "job", 1, 2, 0, nullptr) == kSuccess);
    EventDescrV5 descr = descr_v5(kCollectives[load], 0, 0, 0);
    void* handle = nullptr;
    REQUIRE(plugin.startEvent(context, &handle, &descr) == kSuccess);
    REQUIRE(handle != nullptr);
    REQUIRE(plugin.finalize(context) == kSuccess);
  }
  const RecordPage& page = mapping.page();
  CHECK(page.queued.load() == 2);
  CHECK(slot_of(page, 1).op == static_cast<std::uint64_t>(kCollectives[0].op));
  CHECK(slot_of(page, 2).op == static_cast<std::uint64_t>(kCollectives[1].op));
}

TEST_CASE("nccl profiler: once the job's communicator is destroyed, its successor records on") {
  ddp::launcher::RecordMapping mapping;
  WorkerEnvironment env(&mapping, 0, 2);
  LoadedPlugin loaded;
  const auto& plugin = loaded.get<ProfilerV5>(kSymbolV5);
  for (int comm = 0; comm < 2; ++comm) {
    void* context = nullptr;
    int mask = 0;
    REQUIRE(plugin.init(&context, comm, &mask, "job", 1, 2, 0, nullptr) == kSuccess);
    EventDescrV5 descr = descr_v5(kCollectives[0], 0, 0, 1);
    void* handle = nullptr;
    REQUIRE(plugin.startEvent(context, &handle, &descr) == kSuccess);
    CHECK(handle != nullptr);
    REQUIRE(plugin.finalize(context) == kSuccess);
  }
  CHECK(mapping.page().queued.load() == 2);
}

// Issue 28: the page is claimed by libddp or the probe after NCCL made the communicator (libddp
// attaches right after ncclCommInitRank): the plugin's first collective finds it taken, and
// turns NCCL's events off from then on.
TEST_CASE("nccl profiler: a page claimed by another writer after init turns NCCL's events off") {
  RankZeroOfTwo job;
  [[maybe_unused]] auto& [mapping, env, loaded, plugin, context, mask] = job;
  CHECK(mask != 0);
  void* words =
      mmap(nullptr, sizeof(RecordPage), PROT_READ | PROT_WRITE, MAP_SHARED, mapping.fd(), 0);
  REQUIRE(words != MAP_FAILED);
  static_cast<RecordPage*>(words)->pid.store(static_cast<std::uint64_t>(getpid()));
  static_cast<RecordPage*>(words)->writer.store(pack_name("libddp"));
  EventDescrV5 descr = descr_v5(kCollectives[0], 0, 0, 1);
  void* handle = nullptr;
  REQUIRE(plugin.startEvent(context, &handle, &descr) == kSuccess);
  CHECK(handle == nullptr);
  CHECK(mask == 0);
  REQUIRE(plugin.finalize(context) == kSuccess);
  munmap(words, sizeof(RecordPage));
}

namespace {

// A send/recv pair to this rank itself, as PyTorch's all_to_all issues one per call: NCCL
// reports the tasks but no kernel channel for them (it gives them no proxy work).
void self_exchange(const ProfilerV5& plugin, void* context, int rank) {
  for (const char* func : {"Send", "Recv"}) {
    EventDescrV5 descr{};
    descr.type = kProfileP2p;
    descr.rank = rank;
    descr.p2p.func = func;
    descr.p2p.datatype = "ncclFloat32";
    descr.p2p.count = 1024;
    descr.p2p.peer = rank;
    descr.p2p.nChannels = 1;
    void* handle = nullptr;
    REQUIRE(plugin.startEvent(context, &handle, &descr) == kSuccess);
    REQUIRE(handle != nullptr);
    REQUIRE(plugin.stopEvent(handle) == kSuccess);
  }
}

// A collective whose kernel runs on `channels` channels, reported as NCCL's proxy thread does.
void collective_with_channels(const ProfilerV5& plugin, void* context, int rank, int channels,
                              bool end_channels = true) {
  EventDescrV5 descr = descr_v5(kCollectives[0], rank, 0, static_cast<std::uint8_t>(channels));
  void* handle = nullptr;
  REQUIRE(plugin.startEvent(context, &handle, &descr) == kSuccess);
  REQUIRE(plugin.stopEvent(handle) == kSuccess);
  std::vector<void*> started;
  for (int c = 0; c < channels; ++c) {
    EventDescrV5 channel{};
    channel.type = kProfileKernelCh;
    channel.parentObj = handle;
    void* channel_handle = nullptr;
    REQUIRE(plugin.startEvent(context, &channel_handle, &channel) == kSuccess);
    started.push_back(channel_handle);
  }
  if (!end_channels) return;
  for (void* h : started) REQUIRE(plugin.stopEvent(h) == kSuccess);
}

}  // namespace

// Issue 28: a send/recv to itself never got a channel event, so its record never finished and
// its entry was never freed: after 1,024 of them the plugin followed nothing more, and
// `finished` stopped while `queued` grew (a hang verdict on a healthy MoE job).
TEST_CASE("nccl profiler: 5,000 steps of all_to_all to itself leave nothing open") {
  RankZeroOfTwo job;
  [[maybe_unused]] auto& [mapping, env, loaded, plugin, context, mask] = job;
  const RecordPage& page = mapping.page();
  for (int step = 1; step <= 5000; ++step) {
    self_exchange(plugin, context, 0);
    collective_with_channels(plugin, context, 0, 2);
    if (page.finished.load() != static_cast<std::uint64_t>(step)) {
      FAIL("step " << step << ": queued " << page.queued.load() << ", finished "
                   << page.finished.load());
    }
  }
  CHECK(page.queued.load() == 5000);
  CHECK(page.started.load() == 5000);
  CHECK(page.p2p_since_ns.load() == 0);  // no send or recv open
  REQUIRE(plugin.finalize(context) == kSuccess);
}

TEST_CASE("nccl profiler: an empty send part (0 elements) is done when NCCL stops it") {
  RankZeroOfTwo job;
  [[maybe_unused]] auto& [mapping, env, loaded, plugin, context, mask] = job;
  EventDescrV5 descr{};
  descr.type = kProfileP2p;
  descr.rank = 0;
  descr.p2p.func = "Send";
  descr.p2p.datatype = "ncclFloat32";
  descr.p2p.count = 0;
  descr.p2p.peer = 1;
  descr.p2p.nChannels = 0;
  void* handle = nullptr;
  REQUIRE(plugin.startEvent(context, &handle, &descr) == kSuccess);
  const RecordPage& page = mapping.page();
  CHECK(page.p2p_since_ns.load() != 0);  // queued, not done
  REQUIRE(plugin.stopEvent(handle) == kSuccess);
  CHECK(page.p2p_since_ns.load() == 0);
  CHECK(page.queued.load() == 0);  // not numbered
  REQUIRE(plugin.finalize(context) == kSuccess);
}

TEST_CASE(
    "nccl profiler: a send to a peer is named in the page while its kernel runs, not numbered, "
    "and a later collective's end frees what came before") {
  RankZeroOfTwo job;
  [[maybe_unused]] auto& [mapping, env, loaded, plugin, context, mask] = job;
  const RecordPage& page = mapping.page();
  EventDescrV5 send{};
  send.type = kProfileP2p;
  send.rank = 0;
  send.p2p.func = "Send";
  send.p2p.datatype = "ncclInt8";
  send.p2p.count = 64;
  send.p2p.peer = 1;
  send.p2p.nChannels = 2;
  void* handle = nullptr;
  REQUIRE(plugin.startEvent(context, &handle, &send) == kSuccess);
  REQUIRE(plugin.stopEvent(handle) == kSuccess);  // enqueued; its channels never report
  CHECK(page.p2p_since_ns.load() != 0);
  CHECK(page.p2p_op.load() == static_cast<std::uint64_t>(Op::kSend));
  CHECK(page.p2p_bytes.load() == 64);
  CHECK(page.p2p_peer.load() == 1);
  CHECK(page.queued.load() == 0);
  // The next collective's kernel ends: NCCL ran the send before it.
  collective_with_channels(plugin, context, 0, 1);
  CHECK(page.finished.load() == 1);
  CHECK(page.p2p_since_ns.load() == 0);
  REQUIRE(plugin.finalize(context) == kSuccess);
}
