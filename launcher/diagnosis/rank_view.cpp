#include "diagnosis/rank_view.hpp"

#include <time.h>

#include <algorithm>
#include <cstdio>

namespace ddp::launcher {
namespace {

constexpr auto kRelaxed = std::memory_order_relaxed;

double age_s(std::uint64_t now_ns, std::uint64_t then_ns) {
  return then_ns == 0 || then_ns > now_ns ? 0.0 : static_cast<double>(now_ns - then_ns) * 1e-9;
}

double seconds(std::uint64_t ns) { return static_cast<double>(ns) * 1e-9; }

void read_steps(const record::RecordPage& page, std::uint64_t last, RankView& view) {
  const std::uint64_t first = last > record::kStepSlots ? last - record::kStepSlots + 1 : 1;
  for (std::uint64_t step = first; step <= last; ++step) {
    const record::StepSlot& slot = page.step_slots[step % record::kStepSlots];
    StepInfo info;
    std::uint64_t begin = 0, ready = 0, finalized = 0;
    const bool stable = record::read_stable(slot, [&](const record::StepSlot& s) {
      info.step = s.step.load(kRelaxed);
      begin = s.begin_ns.load(kRelaxed);
      ready = s.ready_ns.load(kRelaxed);
      finalized = s.finalized_ns.load(kRelaxed);
    });
    if (!stable || info.step != step || ready == 0 || finalized == 0) continue;
    info.compute_s = ready > begin ? seconds(ready - begin) : 0.0;
    info.wait_s = finalized > ready ? seconds(finalized - ready) : 0.0;
    view.recent_steps.push_back(info);
  }
}

// A view of the same rank with none of the record read yet (for another lane).
RankView identity_of(const RankView& view) {
  RankView other;
  other.rank = view.rank;
  other.local_rank = view.local_rank;
  other.host = view.host;
  other.pid = view.pid;
  other.remote = view.remote;
  other.running = view.running;
  other.exit_text = view.exit_text;
  other.python = view.python;
  return other;
}

// Lane `lane` of `page` into `view`: which communicator, its counters, pending and last.
void read_lane(const record::RecordPage& page, std::uint32_t lane, std::uint64_t now_ns,
               RankView& view) {
  const record::ConstLane words = record::lane_of(page, lane);
  view.lane = static_cast<int>(lane);
  view.context = words.context->load(kRelaxed);
  view.backend = record::unpack_name(words.backend->load(kRelaxed));
  view.queued = words.queued->load(kRelaxed);
  view.finished = words.finished->load(kRelaxed);
  const std::uint64_t last_finished_ns = words.last_finished_ns->load(kRelaxed);
  if (view.finished > 0 && last_finished_ns != 0) {
    view.since_finished_s = age_s(now_ns, last_finished_ns);
  }
  view.failed = words.failed->load(kRelaxed) != 0;
  if (const std::uint64_t timeout = words.timeout_ms->load(kRelaxed); timeout > 0) {
    view.timeout_s = static_cast<double>(timeout) / 1000.0;
  }
  if (view.queued > view.finished) {
    view.pending = read_collective(page, view.finished + 1, now_ns, lane);
  }
  view.last = read_collective(page, view.finished, now_ns, lane);
  view.unrecorded = words.unrecorded->load(kRelaxed);
  if (const std::uint64_t since = words.p2p_since_ns->load(kRelaxed); since != 0) {
    P2pWait wait;
    wait.op = record::op_name(words.p2p_op->load(kRelaxed));
    wait.bytes = words.p2p_bytes->load(kRelaxed);
    if (const std::uint64_t peer = words.p2p_peer->load(kRelaxed); peer != record::kNoPeer) {
      wait.peer = peer;
    }
    wait.age_s = age_s(now_ns, since);
    // The thread may have returned between the reads: a wait that ended is no wait.
    if (words.p2p_since_ns->load(kRelaxed) == since) view.p2p = wait;
  }
}

}  // namespace

std::uint64_t monotonic_now_ns() {
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<std::uint64_t>(now.tv_sec) * 1'000'000'000ull +
         static_cast<std::uint64_t>(now.tv_nsec);
}

std::string rank_who(const RankView& view) {
  return "rank " + std::to_string(view.rank) + " (" +
         (view.host.empty() ? "" : "host " + view.host + ", ") + "pid " + std::to_string(view.pid) +
         ")";
}

std::optional<CollectiveInfo> read_collective(const record::RecordPage& page, std::uint64_t seq,
                                              std::uint64_t now_ns, std::uint32_t lane) {
  if (seq == 0 || lane >= record::kCommunicatorLanes) return std::nullopt;
  const record::CollectiveSlot& slot =
      record::lane_of(page, lane).collectives[seq % record::kCollectiveSlots];
  CollectiveInfo info;
  std::uint64_t op = 0, dtype = 0, bucket = 0, queued = 0, started = 0, finished = 0, failed = 0;
  const bool stable = record::read_stable(slot, [&](const record::CollectiveSlot& s) {
    info.seq = s.seq.load(kRelaxed);
    op = s.op.load(kRelaxed);
    dtype = s.dtype.load(kRelaxed);
    info.count = s.count.load(kRelaxed);
    info.bytes = s.bytes.load(kRelaxed);
    bucket = s.bucket.load(kRelaxed);
    queued = s.queued_ns.load(kRelaxed);
    started = s.started_ns.load(kRelaxed);
    finished = s.finished_ns.load(kRelaxed);
    failed = s.failed.load(kRelaxed);
  });
  if (!stable || info.seq != seq) return std::nullopt;
  info.op = record::op_name(op);
  info.dtype = record::unpack_name(dtype);
  if (bucket != record::kNoBucket) info.bucket = bucket;
  info.age_s = age_s(now_ns, queued);
  info.started = started != 0;
  info.finished = finished != 0;
  info.failed = failed != 0;
  return info;
}

void read_record(const record::RecordPage& page, std::uint64_t now_ns, RankView& view) {
  view.attached = page.magic.load(std::memory_order_acquire) == record::kRecordMagic;
  if (!view.attached) return;
  view.python = page.writer.load(kRelaxed) == record::pack_name("torch");
  view.nccl_profiler = page.writer.load(kRelaxed) == record::pack_name("ncclprof");
  read_lane(page, 0, now_ns, view);  // lane 0 is read whatever its state (the probe's, v1)
  view.steps = page.steps.load(kRelaxed);
  view.compute_s_total = seconds(page.compute_ns_total.load(kRelaxed));
  view.wait_s_total = seconds(page.wait_ns_total.load(kRelaxed));
  read_steps(page, view.steps, view);
  if (page.version.load(kRelaxed) < 2) return;  // no lanes
  for (std::uint32_t lane = 1; lane < record::kCommunicatorLanes; ++lane) {
    // A closed lane still says what its communicator last did (a rank that exited).
    const auto state = record::lane_of(page, lane).state->load(std::memory_order_acquire);
    if (state != static_cast<std::uint64_t>(record::LaneState::kOpen) &&
        state != static_cast<std::uint64_t>(record::LaneState::kClosed)) {
      continue;
    }
    RankView other = identity_of(view);
    other.attached = true;
    read_lane(page, lane, now_ns, other);
    view.lanes.push_back(std::move(other));
  }
}

namespace {
// Keys of lanes whose context is unknown: their index, above every context.
constexpr std::uint64_t kLaneKey = 1ull << 63;
}  // namespace

std::uint64_t communicator_key(const RankView& lane_view) {
  return lane_view.context != 0 ? lane_view.context
                                : kLaneKey | static_cast<std::uint64_t>(lane_view.lane);
}

std::vector<std::uint64_t> extra_communicators(const std::vector<RankView>& ranks) {
  std::vector<std::uint64_t> keys;
  for (const RankView& r : ranks) {
    for (const RankView& l : r.lanes) keys.push_back(communicator_key(l));
  }
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  return keys;
}

std::vector<RankView> communicator_views(const std::vector<RankView>& ranks, std::uint64_t key) {
  std::vector<RankView> views;
  for (const RankView& r : ranks) {
    auto it = std::find_if(r.lanes.begin(), r.lanes.end(),
                           [key](const RankView& l) { return communicator_key(l) == key; });
    if (it != r.lanes.end()) {
      views.push_back(*it);
      continue;
    }
    RankView detached = identity_of(r);
    detached.lane = -1;
    if ((key & kLaneKey) == 0) detached.context = key;
    views.push_back(std::move(detached));
  }
  return views;
}

std::string communicator_name(const RankView& view) {
  std::string name;
  if (view.python && view.context != 0) {
    // The probe's context is the c10d group's name + 1, or a hash of a hashed name.
    constexpr std::uint64_t kHashed = 1ull << 62;
    char hashed[32];
    std::snprintf(hashed, sizeof hashed, "%08llx",
                  static_cast<unsigned long long>(view.context & (kHashed - 1)));
    name = "process group " +
           (view.context & kHashed ? std::string(hashed) : std::to_string(view.context - 1));
  } else if (view.context != 0) {
    name = "communicator " + std::to_string(view.context);
  } else {
    name = "lane " + std::to_string(view.lane);
  }
  return view.backend.empty() ? name : name + " (" + view.backend + ")";
}

}  // namespace ddp::launcher
