#pragma once
// What the ranks' collective records say, in plain words: which collective the job is at,
// who waits in it, who never entered it, who called it with another op, dtype or count; and
// whether that is a hang. Pure logic over RankViews (tested without processes). Internal to
// the launcher.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "diagnosis/rank_view.hpp"

namespace ddp::launcher {

struct CollectiveDiagnosis {
  std::optional<std::uint64_t> collective;  // the collective the job is at, if any rank records
  std::string headline;            // one line, no "ddprun: " and no newline; empty: no records
  std::vector<std::string> ranks;  // one line per rank, in rank order
  std::vector<int> blamed;         // never entered it, or the odd ones out of a desync
  bool desync = false;             // ranks entered it with different op, dtype or count
};

// The state of the job's collectives now (for kill -USR1 and failure reports). ranks: every
// rank the agent knows of, in any order. rank_lines false: `ranks` left empty (a verdict for
// other nodes, which print their own ranks' lines).
CollectiveDiagnosis diagnose(std::vector<RankView> ranks, bool rank_lines = true);

// The same for each of the processes' other communicators (RankView::lanes), named
// ("communicator 2 (nccl)"), in lane order; empty when every process has one communicator.
std::vector<std::pair<std::string, CollectiveDiagnosis>> diagnose_lanes(
    const std::vector<RankView>& ranks);

// A hang: in one communicator, some rank has waited in a collective for at least
// hang_timeout_s, and no rank has finished one for that long. Then the diagnosis, whose
// headline starts "the job hung at collective K" (the processes' first communicator) or "the
// job hung in communicator 2 (nccl) at collective K" (another one); otherwise nullopt.
std::optional<CollectiveDiagnosis> judge_hang(const std::vector<RankView>& ranks,
                                              double hang_timeout_s, bool rank_lines = true);

// A list of ranks names at most this many runs ("0-511" is one run), then says how many more.
inline constexpr std::size_t kRankListRuns = 16;
// At most this many ranks that never entered a collective are described one by one.
inline constexpr std::size_t kAbsentRanksDescribed = 3;
// At most this many different calls of one collective are spelled out in a desync.
inline constexpr std::size_t kDesyncCallsShown = 4;
// A verdict's headline stays under this many bytes, whatever the world size (it is also the
// stop reason sent through the rendezvous: an etcd value).
inline constexpr std::size_t kHeadlineMaxBytes = 2048;

// "0-6", "0, 2, 5-7": ranks in short form (sorted, duplicates dropped); past max_runs runs,
// "0, 2, 4 and 497 more ranks".
std::string rank_list(std::vector<int> ranks, std::size_t max_runs = kRankListRuns);
// "12.0 MiB", "512 B".
std::string byte_text(std::uint64_t bytes);
// "300 s", "2.5 s".
std::string duration_text(double seconds);

}  // namespace ddp::launcher
