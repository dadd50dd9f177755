#pragma once
// The NCCL profiler plugin's side of the collective record (ddp/common/collective_record.hpp):
// maps the page ddprun handed the worker (DDPRUN_RECORD_FD), claims it for one communicator,
// and numbers and records that communicator's collectives. The same layout rules as libddp's
// CollectiveRecorder (runtime/collective_recorder.*): claim by a compare-exchange of `pid`
// from 0, header filled and published by storing kRecordMagic last, each slot written inside
// begin_write / end_write, a slot reused only once the collective it held finished.
//
// Threads: not synchronised. NCCL calls the plugin from the launching thread, CUDA's
// host-callback thread and its proxy threads; the plugin serialises every call below under
// one lock (nccl_profiler_plugin.cpp), which also keeps two writers off one slot.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "ddp/common/collective_record.hpp"

namespace ddp::nccl_profiler {

// The page's writer word for this plugin: pack_name keeps 8 characters ("nccl-profiler" does
// not fit).
inline constexpr const char* kWriterName = "ncclprof";

class PageWriter {
 public:
  // Maps the page named by DDPRUN_RECORD_FD. nullopt, silently, when the variable is unset or
  // empty (not under ddprun); nullopt and one line in `problem` when it names no usable page.
  static std::optional<PageWriter> open_from_environment(std::string& problem);
  // The same for a descriptor.
  static std::optional<PageWriter> open(int fd, std::string& problem);
  ~PageWriter();  // unmaps the page
  PageWriter(PageWriter&& other) noexcept : page_(std::exchange(other.page_, nullptr)) {}
  PageWriter(const PageWriter&) = delete;
  PageWriter& operator=(const PageWriter&) = delete;

  // Takes the page for a communicator (rank of world_size) if no process has claimed it, and
  // publishes it; or takes it back from an earlier load of the plugin in this process (same
  // pid, writer kWriterName), numbering on from its last collective. False when libddp, the
  // Python probe or another process owns it: the plugin then records nothing (they record on
  // their own). Once true, later calls return true.
  bool claim(int rank, int world_size);
  bool claimed() const { return claimed_; }

  // A collective was handed to NCCL's stream: numbers it (1, 2, ...) and records it. Returns
  // its number. As in libddp, every collective is counted (ranks must agree on the numbers),
  // but one whose slot still holds an unfinished collective is not written there.
  std::uint64_t on_queued(record::Op op, std::uint64_t dtype, std::uint64_t count,
                          std::uint64_t bytes);
  // Collective `seq` began to run (its kernel started on a channel).
  void on_started(std::uint64_t seq);
  // Collective `seq` completed (its kernel finished on every channel).
  void on_finished(std::uint64_t seq);
  // The oldest send or recv not yet done (sends and receives are not numbered: one rank's
  // send meets one rank's recv, and ranks send and receive unevenly), issued at since_ns;
  // since_ns 0: none.
  void on_p2p(std::uint64_t since_ns, record::Op op, std::uint64_t bytes, std::uint64_t peer);

  // Whether another writer (libddp, the Python probe, another process) owns the page: then
  // no communicator of this process will record.
  bool owned_elsewhere() const;

  const record::RecordPage& page() const { return *page_; }

 private:
  explicit PageWriter(record::RecordPage* page) : page_(page) {}

  record::RecordPage* page_;  // mapped MAP_SHARED; nullptr once moved from
  bool claimed_ = false;
  std::uint64_t next_seq_ = 0;
};

}  // namespace ddp::nccl_profiler
