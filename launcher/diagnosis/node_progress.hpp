#pragma once
// What judge_hang needs of one node's ranks, in a few bytes: per communicator, how long ago
// the node's ranks last finished a collective and how long the longest waiter among them has
// waited. A gatherer that holds every node's progress knows whether a hang is possible without
// reading, parsing and judging every rank's view; it reads those only then (and for the names
// they give). Pure logic. Internal to the launcher.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "diagnosis/rank_view.hpp"

namespace ddp::launcher {

// One communicator of one node's ranks.
struct CommunicatorProgress {
  std::uint64_t key = 0;  // 0: the processes' first one (lane 0); else its communicator_key
  std::optional<double> finished_s;  // since a recording rank of it last finished a collective
                                     // (the most recent); unset: none did
  std::optional<double> waited_s;    // the longest wait of a running recording rank in one of
                                     // its collectives, sends or recvs; unset: none waits
  bool operator==(const CommunicatorProgress&) const = default;
};

// A node's progress: its communicators, by key (ascending, the first communicator first).
struct NodeProgress {
  std::vector<CommunicatorProgress> communicators;
  bool operator==(const NodeProgress&) const = default;
};

// The progress of views (one node's ranks), as judge_hang reads them: ages to the millisecond,
// as encode_views keeps them.
NodeProgress progress_of(const std::vector<RankView>& views);

// Every age grown by seconds (progress received that long ago).
void age_progress(NodeProgress& progress, double seconds);

// "0:12:-;18:5000:300000": key, then both ages in milliseconds ("-": unset), per communicator.
std::string encode_progress(const NodeProgress& progress);
// Throws std::invalid_argument naming what is wrong when text is not what encode_progress wrote.
NodeProgress decode_progress(std::string_view text);

// The communicators (keys as in NodeProgress) in which the ranks of every node, together, hang
// as judge_hang says (some rank has waited for hang_timeout_s, none finished a collective in
// that time): judge_hang over the views that `nodes` were taken from (aged alike) finds a hang
// exactly when this is not empty.
std::vector<std::uint64_t> hung_communicators(const std::vector<NodeProgress>& nodes,
                                              double hang_timeout_s);

}  // namespace ddp::launcher
