#pragma once
// The writer side of the collective record (ddp/common/collective_record.hpp): a
// communicator numbers its collectives and stores, for each, what it is and when it was
// queued, started and finished, in a shared-memory page that the agent reads at any moment.
// The Reducer adds its step boundaries. Internal to libddp.
//
// Cost: the hot-path calls are a handful of relaxed atomic stores into the mapped page and a
// clock read (vDSO): no syscall, no lock, no allocation. A communicator without a recorder
// (recording off) pays one null check per call.
//
// Threads: on_queued is called by the thread that issues the collectives (one per
// communicator); on_started / on_finished by whoever runs them (the Gloo communication
// thread, NCCL's stream callback), in issue order; the step calls by the Reducer's thread.
// Writers of one slot take turns (its seqlock is claimed by compare-exchange): the watchdog
// finishing k, a waiter finishing k + 1 and the issuing thread reusing k's slot for
// k + kCollectiveSlots (once `finished` passed k) never leave a mix of two collectives.
//
// Several communicators of one process share the page, each in a lane of its own (see
// ddp/common/collective_record.hpp); a recorder gives its lane back when it is destroyed. The
// page itself is written through the one C++ page writer (ddp/common/record_page_writer.hpp);
// this class adds libddp's part: which communicator, what its calls are, the Reducer's steps.

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>

#include "call_check.hpp"
#include "ddp/common/collective_record.hpp"
#include "ddp/common/record_page_writer.hpp"
#include "ddp/types.hpp"

namespace ddp::detail {

class CollectiveRecorder {
 public:
  // Maps the record page `fd` (unset: the descriptor named by DDPRUN_RECORD_FD, when that is
  // set and not empty; -1: recording off), claims a lane for this communicator, fills the
  // headers and publishes them. Returns nullptr (recording off) when there is no page, when
  // the value or the descriptor is unusable (one warning line on stderr naming it; never an
  // error), or when another process already claimed the page (its pid field). With every
  // lane taken, it warns once and returns a recorder that records nothing but still sees the
  // agent's stop request. timeout: the collective timeout the program waits with
  // (InitOptions::timeout), for the agent's rule of when a hang may be stopped (0: unknown).
  // context: which Context of the process this is (1, 2, ... in init() order).
  static std::unique_ptr<CollectiveRecorder> attach(std::optional<int> fd, int rank, int world_size,
                                                    Backend backend,
                                                    std::chrono::milliseconds timeout = {},
                                                    std::uint64_t context = 1);
  // Records what never finished as failed, gives the lane back (closed: still read by the
  // agent) and unmaps the page.
  ~CollectiveRecorder();
  CollectiveRecorder(const CollectiveRecorder&) = delete;
  CollectiveRecorder& operator=(const CollectiveRecorder&) = delete;

  // A collective was issued: numbers it (1, 2, ...) and records it. `dtype` is
  // record::pack_name of its name (0 for none), `bucket` the Reducer bucket or
  // record::kNoBucket. Returns its number for the calls below.
  std::uint64_t on_queued(record::Op op, std::uint64_t dtype, std::uint64_t count,
                          std::uint64_t bytes, std::uint64_t bucket);
  // The same from a call's descriptor (count per rank for allgather / reduce_scatter).
  std::uint64_t on_queued(const CallDescriptor& call, std::uint64_t bucket);
  // Collective `seq` began to run.
  void on_started(std::uint64_t seq);
  // Collective `seq` completed, with an error when `failed`.
  void on_finished(std::uint64_t seq, bool failed);

  // The lane this recorder writes (0, 1, ...); -1: none was free, nothing is recorded.
  int lane() const { return writer_.lane(); }

  // Reducer step marks. Only the Reducer of one Context records steps (the page has one
  // step ring): the first to begin one; the others' calls do nothing. step_begin: a synchronised
  // step's first gradient is ready (the step began when the previous one was finalized, or now for
  // the first); no-op while a step is open. step_ready: the last bucket's gradients are ready
  // (begins a step if none is open). step_finalized: every bucket was reduced; closes the step and
  // adds its compute and wait time to the totals (no-op when no step is open).
  void step_begin();
  void step_ready();
  void step_finalized();

  // True once the agent asked the workers to stop (the job hung: RecordPage::stop_requested).
  // Any thread; one relaxed load.
  bool stop_requested() const {
    return writer_.page().stop_requested.load(std::memory_order_relaxed) != 0;
  }

  // The page, for tests.
  const record::RecordPage& page() const { return writer_.page(); }

  // The record's name of a dtype ("float32", "bfloat16", ... as PyTorch names them), packed.
  static std::uint64_t dtype_word(DType dtype);

 private:
  CollectiveRecorder(record::RecordPageWriter writer, std::uint64_t context)
      : writer_(std::move(writer)), context_(context) {}
  // Whether this recorder's Reducer records the page's steps (claims them at the first call).
  bool owns_steps();

  record::RecordPageWriter writer_;  // the page, mapped; this communicator's lane, if any
  std::uint64_t context_;            // which Context of the process
  int owns_steps_ = -1;              // -1: not asked yet; 0 / 1
  // The Reducer thread's view of the current step.
  std::uint64_t step_ = 0;
  bool step_open_ = false;
  std::uint64_t step_begin_ns_ = 0;
  std::uint64_t step_ready_ns_ = 0;
  std::uint64_t last_finalized_ns_ = 0;
  std::uint64_t compute_ns_total_ = 0;
  std::uint64_t wait_ns_total_ = 0;
};

}  // namespace ddp::detail
