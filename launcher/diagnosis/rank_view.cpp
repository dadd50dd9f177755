#include "rank_view.hpp"

#include <time.h>

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
                                              std::uint64_t now_ns) {
  if (seq == 0) return std::nullopt;
  const record::CollectiveSlot& slot = page.collectives[seq % record::kCollectiveSlots];
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
  view.backend = record::unpack_name(page.backend.load(kRelaxed));
  view.queued = page.queued.load(kRelaxed);
  view.finished = page.finished.load(kRelaxed);
  const std::uint64_t last_finished_ns = page.last_finished_ns.load(kRelaxed);
  if (view.finished > 0 && last_finished_ns != 0) {
    view.since_finished_s = age_s(now_ns, last_finished_ns);
  }
  view.failed = page.failed.load(kRelaxed) != 0;
  view.python = page.writer.load(kRelaxed) == record::pack_name("torch");
  if (const std::uint64_t timeout = page.timeout_ms.load(kRelaxed); timeout > 0) {
    view.timeout_s = static_cast<double>(timeout) / 1000.0;
  }
  if (view.queued > view.finished) view.pending = read_collective(page, view.finished + 1, now_ns);
  view.last = read_collective(page, view.finished, now_ns);
  view.steps = page.steps.load(kRelaxed);
  view.compute_s_total = seconds(page.compute_ns_total.load(kRelaxed));
  view.wait_s_total = seconds(page.wait_ns_total.load(kRelaxed));
  read_steps(page, view.steps, view);
}

}  // namespace ddp::launcher
