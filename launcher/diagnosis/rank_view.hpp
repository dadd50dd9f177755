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

  // What ranks must agree on: op, dtype and count (an all_to_all's count is the rank's own
  // split, which may differ between ranks).
  bool same_call(const CollectiveInfo& other) const {
    return op == other.op && dtype == other.dtype &&
           (count == other.count || op == record::op_name(std::uint64_t(record::Op::kAllToAll)));
  }
};

// A send or recv a thread of the rank is blocked in (no collective number: the probe records
// the oldest one a thread waits for).
struct P2pWait {
  std::string op;  // "send", "recv"
  std::uint64_t bytes = 0;
  std::optional<std::uint64_t> peer;  // the group's rank it sends to or receives from; unset: any
  double age_s = 0;                   // since the thread began to wait
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
  std::optional<P2pWait> p2p;          // a send or recv it waits in now, if any
  std::uint64_t unrecorded = 0;        // collectives it left unrecorded (a signal handler's, issued
                                       // while it recorded): its numbers lag behind its group's
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

// Which communicator a lane records, the same on every rank: its context when known (libddp's
// Context number, the probe's process group), else its lane index, told apart.
std::uint64_t communicator_key(const RankView& lane_view);
// The communicators that some rank of `ranks` records in besides lane 0 (its keys), ascending.
std::vector<std::uint64_t> extra_communicators(const std::vector<RankView>& ranks);
// Every rank's view of the communicator `key` names, whichever lane each rank holds it in; a
// rank without it gives a detached view (attached false) with its identity.
std::vector<RankView> communicator_views(const std::vector<RankView>& ranks, std::uint64_t key);
// "communicator 2 (nccl)", "process group 1 (gloo)": how reports name the communicator of
// `view` (its lane when the context is unknown).

std::string communicator_name(const RankView& view);

// CLOCK_MONOTONIC in nanoseconds: the clock of every record on this node.
std::uint64_t monotonic_now_ns();

// "rank 3 (host node-a, pid 4242)": the rank as reports name it (the host only when known).
std::string rank_who(const RankView& view);

}  // namespace ddp::launcher
