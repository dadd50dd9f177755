#include "collective_recorder.hpp"

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>

#include "ddp/common/worker_contract.hpp"
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
  std::string problem;
  const auto chosen = RecordPageWriter::fd_from_environment(problem);
  if (!problem.empty()) warn(rank, problem);
  return chosen;
}

}  // namespace

std::unique_ptr<CollectiveRecorder> CollectiveRecorder::attach(std::optional<int> fd, int rank,
                                                               int world_size, Backend backend,
                                                               std::chrono::milliseconds timeout,
                                                               std::uint64_t context) {
  const auto chosen = choose_fd(fd, rank);
  if (!chosen) return nullptr;
  const std::string name =
      RecordPageWriter::descriptor_name(*chosen) +
      (fd ? std::string() : std::string(" (") + ddp::contract::kRecordFd + ")");
  std::string problem;
  auto writer = RecordPageWriter::map(*chosen, name, "a launcher", problem);
  if (!writer) {
    warn(rank, problem);
    return nullptr;
  }
  // The first communicator of the process claims the page; later ones of this process share
  // it (a lane each); a child that inherited the descriptor leaves it to its owner.
  const std::uint64_t owner = writer->claim_page();
  if (owner != 0 && owner != RecordPageWriter::this_process()) {
    warn(rank, name + " belongs to process " + std::to_string(owner) +
                   " (inherited from a parent that records there)");
    return nullptr;
  }
  writer->write_header(static_cast<std::uint64_t>(rank), static_cast<std::uint64_t>(world_size));
  LaneOwner lane_owner;
  lane_owner.context = context;
  lane_owner.backend = pack_name(to_string(backend));
  lane_owner.rank = static_cast<std::uint64_t>(rank);
  lane_owner.world_size = static_cast<std::uint64_t>(world_size);
  lane_owner.timeout_ms = static_cast<std::uint64_t>(std::max<std::int64_t>(timeout.count(), 0));
  if (!writer->open_lane(lane_owner)) {
    warn(rank, "every lane of " + name + " is taken (" + std::to_string(kCommunicatorLanes) +
                   " communicators record at once); communicator " + std::to_string(context) +
                   " (" + to_string(backend) + ")");
  }
  writer->publish();
  return std::unique_ptr<CollectiveRecorder>(new CollectiveRecorder(std::move(*writer), context));
}

CollectiveRecorder::~CollectiveRecorder() {
  if (owns_steps_ == 1) writer_.page().step_context.store(0, std::memory_order_release);
  writer_.close_lane();
}

bool CollectiveRecorder::owns_steps() {
  if (owns_steps_ < 0) {
    RecordPage& page = writer_.page();
    std::uint64_t owner = 0;
    owns_steps_ =
        page.step_context.compare_exchange_strong(owner, context_, std::memory_order_acq_rel) ||
        owner == context_;
    if (owns_steps_ == 1) {  // the step ring and totals go on from an earlier Reducer's
      step_ = page.steps.load(std::memory_order_relaxed);
      compute_ns_total_ = page.compute_ns_total.load(std::memory_order_relaxed);
      wait_ns_total_ = page.wait_ns_total.load(std::memory_order_relaxed);
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
  return writer_.on_queued(op, dtype, count, bytes, bucket);
}

std::uint64_t CollectiveRecorder::on_queued(const CallDescriptor& call, std::uint64_t bucket) {
  if (call.kind == CallKind::Barrier) return on_queued(Op::kBarrier, 0, 0, 0, kNoBucket);
  return on_queued(op_of(call.kind), dtype_word(call.dtype), call.count,
                   call.count * size_of(call.dtype), bucket);
}

void CollectiveRecorder::on_started(std::uint64_t seq) { writer_.on_started(seq); }

void CollectiveRecorder::on_finished(std::uint64_t seq, bool failed) {
  writer_.on_finished(seq, failed);
}

void CollectiveRecorder::step_begin() {
  if (step_open_ || !owns_steps()) return;
  const std::uint64_t now = now_ns();
  ++step_;
  step_open_ = true;
  step_begin_ns_ = last_finalized_ns_ != 0 ? last_finalized_ns_ : now;
  step_ready_ns_ = 0;
  StepSlot& slot = writer_.page().step_slots[step_ % kStepSlots];
  begin_write(slot);
  slot.step.store(step_, std::memory_order_relaxed);
  slot.begin_ns.store(step_begin_ns_, std::memory_order_relaxed);
  slot.ready_ns.store(0, std::memory_order_relaxed);
  slot.finalized_ns.store(0, std::memory_order_relaxed);
  end_write(slot);
  writer_.page().steps.store(step_, std::memory_order_release);
}

void CollectiveRecorder::step_ready() {
  step_begin();
  if (!step_open_ || step_ready_ns_ != 0) return;
  step_ready_ns_ = now_ns();
  StepSlot& slot = writer_.page().step_slots[step_ % kStepSlots];
  begin_write(slot);
  slot.ready_ns.store(step_ready_ns_, std::memory_order_relaxed);
  end_write(slot);
}

void CollectiveRecorder::step_finalized() {
  if (!step_open_) return;
  const std::uint64_t now = now_ns();
  if (step_ready_ns_ == 0) step_ready_ns_ = now;  // no bucket to launch: ready as it ends
  StepSlot& slot = writer_.page().step_slots[step_ % kStepSlots];
  begin_write(slot);
  slot.ready_ns.store(step_ready_ns_, std::memory_order_relaxed);
  slot.finalized_ns.store(now, std::memory_order_relaxed);
  end_write(slot);
  compute_ns_total_ += step_ready_ns_ - step_begin_ns_;
  wait_ns_total_ += now - step_ready_ns_;
  writer_.page().compute_ns_total.store(compute_ns_total_, std::memory_order_relaxed);
  writer_.page().wait_ns_total.store(wait_ns_total_, std::memory_order_relaxed);
  step_open_ = false;
  last_finalized_ns_ = now;
}

}  // namespace ddp::detail
