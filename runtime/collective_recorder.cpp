#include "collective_recorder.hpp"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>
#include <string>

#include "ddp/common/worker_contract.hpp"
#include "ddp/launch_env.hpp"
#include "ddp/logger.hpp"

namespace ddp::detail {

namespace {

using namespace ddp::record;

Op op_of(CallKind kind) {
  switch (kind) {
    case CallKind::Allreduce:
      return Op::kAllReduce;
    case CallKind::Broadcast:
      return Op::kBroadcast;
    case CallKind::Allgather:
      return Op::kAllGather;
    case CallKind::ReduceScatter:
      return Op::kReduceScatter;
    case CallKind::Barrier:
      return Op::kBarrier;
  }
  return Op::kNone;
}

void warn(int rank, const std::string& what) {
  Logger(rank, true)
      .all("ddp: ", what, "; collectives are not recorded (the agent's hang and ",
           "straggler reports will not cover this rank)");
}

// The descriptor to map: `fd` when given, else DDPRUN_RECORD_FD's value. nullopt: none (or
// an unusable value, warned about).
std::optional<int> choose_fd(std::optional<int> fd, int rank) {
  if (fd) return *fd >= 0 ? fd : std::nullopt;
  const auto value = get_env(ddp::contract::kRecordFd);
  if (!value || value->empty()) return std::nullopt;
  int parsed = -1;
  const char* end = value->data() + value->size();
  const auto [ptr, ec] = std::from_chars(value->data(), end, parsed);
  if (ec != std::errc() || ptr != end || parsed < 0) {
    warn(rank,
         std::string(ddp::contract::kRecordFd) + "='" + *value + "' is not a descriptor number");
    return std::nullopt;
  }
  return parsed;
}

// Claims a lane for Context `context`: its own ((context - 1) % kCommunicatorLanes, the same
// on every rank), else the next free one. -1: none is free.
int claim_lane(RecordPage& page, std::uint64_t context) {
  const auto own =
      static_cast<std::uint32_t>((context == 0 ? 0 : context - 1) % kCommunicatorLanes);
  for (std::uint32_t i = 0; i < kCommunicatorLanes; ++i) {
    const std::uint32_t index = (own + i) % kCommunicatorLanes;
    std::atomic<std::uint64_t>& state = *lane_of(page, index).state;
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

// Names a claimed lane's communicator and opens it (readers skip it until then).
void fill_lane(Lane lane, std::uint64_t context, int rank, int world_size, Backend backend,
               std::chrono::milliseconds timeout) {
  lane.context->store(context, std::memory_order_relaxed);
  lane.backend->store(pack_name(to_string(backend)), std::memory_order_relaxed);
  lane.rank->store(static_cast<std::uint64_t>(rank), std::memory_order_relaxed);
  lane.world_size->store(static_cast<std::uint64_t>(world_size), std::memory_order_relaxed);
  lane.timeout_ms->store(static_cast<std::uint64_t>(std::max<std::int64_t>(timeout.count(), 0)),
                         std::memory_order_relaxed);
  // A destroyed communicator's collectives that never finished are gone with it.
  const std::uint64_t queued = lane.queued->load(std::memory_order_relaxed);
  if (lane.finished->load(std::memory_order_relaxed) < queued) {
    lane.finished->store(queued, std::memory_order_release);
  }
  lane.state->store(static_cast<std::uint64_t>(LaneState::kOpen), std::memory_order_release);
}

}  // namespace

std::unique_ptr<CollectiveRecorder> CollectiveRecorder::attach(std::optional<int> fd, int rank,
                                                               int world_size, Backend backend,
                                                               std::chrono::milliseconds timeout,
                                                               std::uint64_t context) {
  const auto chosen = choose_fd(fd, rank);
  if (!chosen) return nullptr;
  const std::string name =
      "the collective record descriptor " + std::to_string(*chosen) +
      (fd ? std::string() : std::string(" (") + ddp::contract::kRecordFd + ")");
  struct stat st {};
  if (fstat(*chosen, &st) != 0) {
    warn(rank, name + " is not open: " + std::strerror(errno));
    return nullptr;
  }
  if (static_cast<std::uint64_t>(st.st_size) != sizeof(RecordPage)) {
    warn(rank, name + " has " + std::to_string(st.st_size) + " bytes, not the " +
                   std::to_string(sizeof(RecordPage)) +
                   " of a record page (a launcher of another version?)");
    return nullptr;
  }
  void* mapped = mmap(nullptr, sizeof(RecordPage), PROT_READ | PROT_WRITE, MAP_SHARED, *chosen, 0);
  if (mapped == MAP_FAILED) {
    warn(rank, name + " could not be mapped: " + std::strerror(errno));
    return nullptr;
  }
  auto* page = static_cast<RecordPage*>(mapped);
  // The first communicator of the process claims the page; later ones of this process share
  // it (a lane each); a child that inherited the descriptor leaves it to its owner.
  std::uint64_t owner = 0;
  const auto pid = static_cast<std::uint64_t>(getpid());
  if (!page->pid.compare_exchange_strong(owner, pid, std::memory_order_acq_rel) && owner != pid) {
    warn(rank, name + " belongs to process " + std::to_string(owner) +
                   " (inherited from a parent that records there)");
    munmap(mapped, sizeof(RecordPage));
    return nullptr;
  }
  page->version.store(kRecordVersion, std::memory_order_relaxed);
  page->rank.store(static_cast<std::uint64_t>(rank), std::memory_order_relaxed);
  page->world_size.store(static_cast<std::uint64_t>(world_size), std::memory_order_relaxed);
  const int lane = claim_lane(*page, context);
  if (lane < 0) {
    warn(rank, "every lane of " + name + " is taken (" + std::to_string(kCommunicatorLanes) +
                   " communicators record at once); communicator " + std::to_string(context) +
                   " (" + to_string(backend) + ")");
  } else {
    fill_lane(lane_of(*page, static_cast<std::uint32_t>(lane)), context, rank, world_size, backend,
              timeout);
  }
  if (page->magic.load(std::memory_order_acquire) != kRecordMagic) {
    page->magic.store(kRecordMagic, std::memory_order_release);  // last: publishes the header
  }
  return std::unique_ptr<CollectiveRecorder>(new CollectiveRecorder(page, lane, context));
}

CollectiveRecorder::CollectiveRecorder(RecordPage* page, int lane, std::uint64_t context)
    : page_(page), lane_index_(lane), context_(context) {
  if (lane < 0) return;
  lane_ = lane_of(*page, static_cast<std::uint32_t>(lane));
  next_seq_ = lane_.queued->load(std::memory_order_relaxed);  // a lane's numbers go on
}

CollectiveRecorder::~CollectiveRecorder() {
  if (owns_steps_ == 1) page_->step_context.store(0, std::memory_order_release);
  if (lane_index_ >= 0) {
    // What never finished is gone with the communicator: failed, not pending for ever (the
    // agent still reads a closed lane, for a rank that exited).
    const std::uint64_t queued = lane_.queued->load(std::memory_order_relaxed);
    std::uint64_t seq = lane_.finished->load(std::memory_order_relaxed) + 1;
    if (queued > kCollectiveSlots) seq = std::max(seq, queued - kCollectiveSlots + 1);
    for (; seq <= queued; ++seq) on_finished(seq, true);
    lane_.state->store(static_cast<std::uint64_t>(LaneState::kClosed), std::memory_order_release);
  }
  munmap(page_, sizeof(RecordPage));
}

bool CollectiveRecorder::owns_steps() {
  if (owns_steps_ < 0) {
    std::uint64_t owner = 0;
    owns_steps_ =
        page_->step_context.compare_exchange_strong(owner, context_, std::memory_order_acq_rel) ||
        owner == context_;
    if (owns_steps_ == 1) {  // the step ring and totals go on from an earlier Reducer's
      step_ = page_->steps.load(std::memory_order_relaxed);
      compute_ns_total_ = page_->compute_ns_total.load(std::memory_order_relaxed);
      wait_ns_total_ = page_->wait_ns_total.load(std::memory_order_relaxed);
    }
  }
  return owns_steps_ == 1;
}

std::uint64_t CollectiveRecorder::dtype_word(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return pack_name("float32");
    case DType::F64:
      return pack_name("float64");
    case DType::I32:
      return pack_name("int32");
    case DType::I64:
      return pack_name("int64");
    case DType::F16:
      return pack_name("float16");
    case DType::BF16:
      return pack_name("bfloat16");
  }
  return 0;
}

std::uint64_t CollectiveRecorder::on_queued(Op op, std::uint64_t dtype, std::uint64_t count,
                                            std::uint64_t bytes, std::uint64_t bucket) {
  if (lane_index_ < 0) return 0;
  const std::uint64_t seq = ++next_seq_;
  const std::uint64_t now = now_ns();
  // The slot's previous collective may be unfinished still (more than a ring in flight):
  // then this collective goes unrecorded rather than hiding the older one.
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

std::uint64_t CollectiveRecorder::on_queued(const CallDescriptor& call, std::uint64_t bucket) {
  if (call.kind == CallKind::Barrier) return on_queued(Op::kBarrier, 0, 0, 0, kNoBucket);
  return on_queued(op_of(call.kind), dtype_word(call.dtype), call.count,
                   call.count * size_of(call.dtype), bucket);
}

void CollectiveRecorder::on_started(std::uint64_t seq) {
  if (lane_index_ < 0 || seq == 0) return;
  const std::uint64_t now = now_ns();
  CollectiveSlot& slot = lane_.collectives[seq % kCollectiveSlots];
  if (slot.seq.load(std::memory_order_relaxed) == seq) {
    begin_write(slot);
    // Checked again under the claim: the slot may have passed to a newer collective.
    if (slot.seq.load(std::memory_order_relaxed) == seq) {
      slot.started_ns.store(now, std::memory_order_relaxed);
    }
    end_write(slot);
  }
  std::uint64_t highest = lane_.started->load(std::memory_order_relaxed);
  while (highest < seq && !lane_.started->compare_exchange_weak(
                              highest, seq, std::memory_order_release, std::memory_order_relaxed)) {
  }
}

void CollectiveRecorder::on_finished(std::uint64_t seq, bool failed) {
  if (lane_index_ < 0 || seq == 0) return;
  const std::uint64_t now = now_ns();
  CollectiveSlot& slot = lane_.collectives[seq % kCollectiveSlots];
  if (slot.seq.load(std::memory_order_relaxed) == seq) {
    begin_write(slot);
    // Checked again under the claim: once a later collective finished, the issuing thread
    // may have reused this slot for seq + kCollectiveSlots.
    if (slot.seq.load(std::memory_order_relaxed) == seq) {
      slot.finished_ns.store(now, std::memory_order_relaxed);
      slot.failed.store(failed ? 1 : 0, std::memory_order_relaxed);
    }
    end_write(slot);
  }
  if (failed) lane_.failed->store(1, std::memory_order_relaxed);
  lane_.last_finished_ns->store(now, std::memory_order_relaxed);
  // Release: the issuing thread may reuse this slot once it sees `finished` pass it.
  std::uint64_t highest = lane_.finished->load(std::memory_order_relaxed);
  while (highest < seq && !lane_.finished->compare_exchange_weak(
                              highest, seq, std::memory_order_release, std::memory_order_relaxed)) {
  }
}

void CollectiveRecorder::step_begin() {
  if (step_open_ || !owns_steps()) return;
  const std::uint64_t now = now_ns();
  ++step_;
  step_open_ = true;
  step_begin_ns_ = last_finalized_ns_ != 0 ? last_finalized_ns_ : now;
  step_ready_ns_ = 0;
  StepSlot& slot = page_->step_slots[step_ % kStepSlots];
  begin_write(slot);
  slot.step.store(step_, std::memory_order_relaxed);
  slot.begin_ns.store(step_begin_ns_, std::memory_order_relaxed);
  slot.ready_ns.store(0, std::memory_order_relaxed);
  slot.finalized_ns.store(0, std::memory_order_relaxed);
  end_write(slot);
  page_->steps.store(step_, std::memory_order_release);
}

void CollectiveRecorder::step_ready() {
  step_begin();
  if (!step_open_ || step_ready_ns_ != 0) return;
  step_ready_ns_ = now_ns();
  StepSlot& slot = page_->step_slots[step_ % kStepSlots];
  begin_write(slot);
  slot.ready_ns.store(step_ready_ns_, std::memory_order_relaxed);
  end_write(slot);
}

void CollectiveRecorder::step_finalized() {
  if (!step_open_) return;
  const std::uint64_t now = now_ns();
  if (step_ready_ns_ == 0) step_ready_ns_ = now;  // no bucket to launch: ready as it ends
  StepSlot& slot = page_->step_slots[step_ % kStepSlots];
  begin_write(slot);
  slot.ready_ns.store(step_ready_ns_, std::memory_order_relaxed);
  slot.finalized_ns.store(now, std::memory_order_relaxed);
  end_write(slot);
  compute_ns_total_ += step_ready_ns_ - step_begin_ns_;
  wait_ns_total_ += now - step_ready_ns_;
  page_->compute_ns_total.store(compute_ns_total_, std::memory_order_relaxed);
  page_->wait_ns_total.store(wait_ns_total_, std::memory_order_relaxed);
  step_open_ = false;
  last_finalized_ns_ = now;
}

}  // namespace ddp::detail
