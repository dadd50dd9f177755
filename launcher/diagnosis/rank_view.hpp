#pragma once
// One rank's collectives as the agent reads them from its record page: what it last
// finished, what it waits in, how long ago. Ages, not clock readings, so that views taken on
// different nodes compare. Internal to the launcher.

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ddp/common/collective_record.hpp"

namespace ddp::launcher {

// One collective of one rank.
struct CollectiveInfo {
  std::uint64_t seq = 0;  // 1, 2, ... per communicator
  std::string op;         // "all_reduce"
  std::string dtype;      // "float32"
  std::uint64_t count = 0;
  std::uint64_t bytes = 0;
  std::optional<std::uint64_t> bucket;  // the Reducer's bucket, if any
  double age_s = 0;                     // since it was queued
  bool started = false;
  bool finished = false;
  bool failed = false;

  // What ranks must agree on: op, dtype and count.
  bool same_call(const CollectiveInfo& other) const {
    return op == other.op && dtype == other.dtype && count == other.count;
  }
};

// One Reducer step.
struct StepInfo {
  std::uint64_t step = 0;
  double compute_s = 0;  // first gradient ready .. last bucket ready
  double wait_s = 0;     // last bucket ready .. finalize() returned
};

// One communicator of one rank: the rank's first (lane 0) is the RankView itself; a process
// with several communicators (libddp records each in a lane of its own) has the others in
// RankView::lanes, each a RankView of the same rank with its own collective fields.
struct RankView {
  int rank = -1;
  int local_rank = -1;
  std::string host;
  pid_t pid = 0;
  bool remote = false;         // another node's rank (its agent shared the view)
  bool running = true;         // the process still runs
  std::string exit_text;       // "exit code 0", when it exited
  bool attached = false;       // libddp or the Python probe records into the page
  bool python = false;         // the Python probe writes the page (PyTorch)
  bool nccl_profiler = false;  // ddprun's NCCL profiler plugin writes it (any NCCL program)
  std::string backend;         // "gloo", "nccl"
  std::uint64_t queued = 0;    // the highest collective number it issued
  std::uint64_t finished = 0;  // the highest it finished
  std::optional<double> since_finished_s;  // since it last finished one; unset: never
  std::optional<CollectiveInfo> pending;   // the collective after `finished`, if issued
  std::optional<CollectiveInfo> last;      // collective `finished`, if still in the ring
  bool failed = false;                     // a collective of it failed
  std::optional<double> timeout_s;         // its own collective timeout, when it said
  std::uint64_t steps = 0;                 // Reducer steps begun
  double compute_s_total = 0;
  double wait_s_total = 0;
  std::vector<StepInfo> recent_steps;  // finished steps still in the ring, oldest first
  int lane = 0;                        // the page's lane this view reads (0: the first)
  std::uint64_t context = 0;    // which communicator of the process: 1, 2, ... in the order the
                                // program made them (the same on every rank); 0: unknown
  std::vector<RankView> lanes;  // the process's other communicators (lanes 1..), live or
                                // destroyed (what they last did), if any
};

// Reads a page at `now_ns` (CLOCK_MONOTONIC). Fills the record's part of the view (attached,
// counters, pending, last, steps); the caller fills rank, host, pid and running.
void read_record(const record::RecordPage& page, std::uint64_t now_ns, RankView& view);

// The collective numbered seq as lane `lane` of `page` holds it, if still in its ring and
// stable.
std::optional<CollectiveInfo> read_collective(const record::RecordPage& page, std::uint64_t seq,
                                              std::uint64_t now_ns, std::uint32_t lane = 0);

// The lanes (communicators) that some rank of `ranks` records in besides lane 0, ascending.
std::vector<int> extra_lanes(const std::vector<RankView>& ranks);
// Every rank's view of lane `lane` (0: the views themselves); a rank without that lane gives
// a detached view (attached false) with its identity.
std::vector<RankView> lane_views(const std::vector<RankView>& ranks, int lane);
// "communicator 2 (nccl)": how reports name the communicator of `view` (its lane when the
// Context is unknown).

std::string communicator_name(const RankView& view);

// CLOCK_MONOTONIC in nanoseconds: the clock of every record on this node.
std::uint64_t monotonic_now_ns();

// "rank 3 (host node-a, pid 4242)": the rank as reports name it (the host only when known).
std::string rank_who(const RankView& view);

}  // namespace ddp::launcher
