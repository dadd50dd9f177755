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

#include "ddp/launch_env.hpp"
#include "ddp/logger.hpp"

namespace ddp::detail {

namespace {

using namespace ddp::record;

static_assert(std::atomic<std::uint64_t>::is_always_lock_free,
              "the record page is shared between processes: its atomics must be lock-free");

std::uint64_t now_ns() {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
}

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
  const auto value = get_env(kRecordFdVariable);
  if (!value || value->empty()) return std::nullopt;
  int parsed = -1;
  const char* end = value->data() + value->size();
  const auto [ptr, ec] = std::from_chars(value->data(), end, parsed);
  if (ec != std::errc() || ptr != end || parsed < 0) {
    warn(rank, std::string(kRecordFdVariable) + "='" + *value + "' is not a descriptor number");
    return std::nullopt;
  }
  return parsed;
}

}  // namespace

std::unique_ptr<CollectiveRecorder> CollectiveRecorder::attach(std::optional<int> fd, int rank,
                                                               int world_size, Backend backend,
                                                               std::chrono::milliseconds timeout) {
  const auto chosen = choose_fd(fd, rank);
  if (!chosen) return nullptr;
  const std::string name = "the collective record descriptor " + std::to_string(*chosen) +
                           (fd ? std::string() : std::string(" (") + kRecordFdVariable + ")");
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
  // The first communicator of the first process claims the page; a second Context of this
  // process, or a child that inherited the descriptor, leaves it to its owner.
  std::uint64_t owner = 0;
  const auto pid = static_cast<std::uint64_t>(getpid());
  if (!page->pid.compare_exchange_strong(owner, pid, std::memory_order_acq_rel)) {
    if (owner != pid) {
      warn(rank, name + " belongs to process " + std::to_string(owner) +
                     " (inherited from a parent that records there)");
    }
    munmap(mapped, sizeof(RecordPage));
    return nullptr;
  }
  page->version.store(kRecordVersion, std::memory_order_relaxed);
  page->rank.store(static_cast<std::uint64_t>(rank), std::memory_order_relaxed);
  page->world_size.store(static_cast<std::uint64_t>(world_size), std::memory_order_relaxed);
  page->backend.store(pack_name(to_string(backend)), std::memory_order_relaxed);
  page->timeout_ms.store(static_cast<std::uint64_t>(std::max<std::int64_t>(timeout.count(), 0)),
                         std::memory_order_relaxed);
  page->magic.store(kRecordMagic, std::memory_order_release);  // last: publishes the header
  return std::unique_ptr<CollectiveRecorder>(new CollectiveRecorder(page));
}

CollectiveRecorder::~CollectiveRecorder() { munmap(page_, sizeof(RecordPage)); }

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
  const std::uint64_t seq = ++next_seq_;
  const std::uint64_t now = now_ns();
  // The slot's previous collective may still be written by the thread that runs it until it
  // finished (see the header): then this collective goes unrecorded rather than racing it.
  if (seq <= kCollectiveSlots ||
      page_->finished.load(std::memory_order_acquire) >= seq - kCollectiveSlots) {
    CollectiveSlot& slot = page_->collectives[seq % kCollectiveSlots];
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
  page_->queued.store(seq, std::memory_order_release);
  return seq;
}

std::uint64_t CollectiveRecorder::on_queued(const CallDescriptor& call, std::uint64_t bucket) {
  if (call.kind == CallKind::Barrier) return on_queued(Op::kBarrier, 0, 0, 0, kNoBucket);
  return on_queued(op_of(call.kind), dtype_word(call.dtype), call.count,
                   call.count * size_of(call.dtype), bucket);
}

void CollectiveRecorder::on_started(std::uint64_t seq) {
  const std::uint64_t now = now_ns();
  CollectiveSlot& slot = page_->collectives[seq % kCollectiveSlots];
  if (slot.seq.load(std::memory_order_relaxed) == seq) {
    begin_write(slot);
    slot.started_ns.store(now, std::memory_order_relaxed);
    end_write(slot);
  }
  page_->started.store(seq, std::memory_order_release);
}

void CollectiveRecorder::on_finished(std::uint64_t seq, bool failed) {
  const std::uint64_t now = now_ns();
  CollectiveSlot& slot = page_->collectives[seq % kCollectiveSlots];
  if (slot.seq.load(std::memory_order_relaxed) == seq) {
    begin_write(slot);
    slot.finished_ns.store(now, std::memory_order_relaxed);
    slot.failed.store(failed ? 1 : 0, std::memory_order_relaxed);
    end_write(slot);
  }
  if (failed) page_->failed.store(1, std::memory_order_relaxed);
  page_->last_finished_ns.store(now, std::memory_order_relaxed);
  // Release: the issuing thread may reuse this slot once it sees `finished` pass it.
  std::uint64_t highest = page_->finished.load(std::memory_order_relaxed);
  while (highest < seq && !page_->finished.compare_exchange_weak(
                              highest, seq, std::memory_order_release, std::memory_order_relaxed)) {
  }
}

void CollectiveRecorder::step_begin() {
  if (step_open_) return;
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
  if (step_ready_ns_ != 0) return;
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
