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
// A slot is written by one thread at a time: the issuing thread reuses the slot of
// collective seq - kCollectiveSlots only once that collective finished, and otherwise leaves
// the slot alone (the record of the newer collective is lost, its counters still move).

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>

#include "call_check.hpp"
#include "ddp/common/collective_record.hpp"
#include "ddp/types.hpp"

namespace ddp::detail {

class CollectiveRecorder {
 public:
  // Maps the record page `fd` (unset: the descriptor named by DDPRUN_RECORD_FD, when that is
  // set and not empty; -1: recording off), fills its header and publishes it. Returns nullptr
  // (recording off) when there is no page, when the value or the descriptor is unusable (one
  // warning line on stderr naming it; never an error), or when another communicator of this
  // process, or another process, already claimed the page (its pid field). timeout: the
  // collective timeout the program waits with (InitOptions::timeout), for the agent's rule of
  // when a hang may be stopped (0: unknown).
  static std::unique_ptr<CollectiveRecorder> attach(std::optional<int> fd, int rank, int world_size,
                                                    Backend backend,
                                                    std::chrono::milliseconds timeout = {});
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

  // Reducer step marks. step_begin: a synchronised step's first gradient is ready (the step
  // began when the previous one was finalized, or now for the first); no-op while a step is
  // open. step_ready: the last bucket's gradients are ready (begins a step if none is open).
  // step_finalized: every bucket was reduced; closes the step and adds its compute and wait
  // time to the totals (no-op when no step is open).
  void step_begin();
  void step_ready();
  void step_finalized();

  // True once the agent asked the workers to stop (the job hung: RecordPage::stop_requested).
  // Any thread; one relaxed load.
  bool stop_requested() const { return page_->stop_requested.load(std::memory_order_relaxed) != 0; }

  // The page, for tests.
  const record::RecordPage& page() const { return *page_; }

  // The record's name of a dtype ("float32", "bfloat16", ... as PyTorch names them), packed.
  static std::uint64_t dtype_word(DType dtype);

 private:
  explicit CollectiveRecorder(record::RecordPage* page) : page_(page) {}

  record::RecordPage* page_;    // mapped MAP_SHARED; unmapped by the destructor
  std::uint64_t next_seq_ = 0;  // the issuing thread's
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
