#include "diagnosis/collective_diagnosis.hpp"

#include <algorithm>
#include <cstdio>
#include <map>

namespace ddp::launcher {
namespace {

// "all_reduce, bucket 3, 12.0 MiB float32"
std::string call_text(const CollectiveInfo& c) {
  std::string text = c.op;
  if (c.bucket) text += ", bucket " + std::to_string(*c.bucket);
  return text + ", " + byte_text(c.bytes) + " " + c.dtype;
}

// "all_reduce of 1024 float32 (4.0 KiB)"
std::string signature_text(const CollectiveInfo& c) {
  if (c.op == "barrier") return c.op;
  return c.op + " of " + std::to_string(c.count) + " " + c.dtype + " (" + byte_text(c.bytes) + ")";
}

// "recv from rank 0 (16 B) for 8.0 s"
std::string p2p_text(const P2pWait& w) {
  std::string text = w.op;
  if (w.peer) text += (w.op == "send" ? " to rank " : " from rank ") + std::to_string(*w.peer);
  if (!w.peer && w.op == "recv") text += " from any rank";
  return text + " (" + byte_text(w.bytes) + ") for " + duration_text(w.age_s);
}

std::string plural_ranks(const std::vector<int>& ranks) {
  return (ranks.size() == 1 ? "rank " : "ranks ") + rank_list(ranks);
}

std::string rank_line(const RankView& r, std::uint64_t k) {
  std::string line = rank_who(r) + ": ";
  if (!r.attached) {
    line +=
        "no collective record (no libddp communicator or Python probe in it, or none made "
        "yet)";
  } else if (r.queued >= k && r.finished < k) {
    line += "waiting in collective " + std::to_string(k);
    if (r.pending) {
      line += " (" + call_text(*r.pending) + ") for " + duration_text(r.pending->age_s);
    }
  } else if (r.finished >= k) {
    line += "finished collective " + std::to_string(r.finished);
  } else if (r.finished == 0) {
    line += "has finished no collective";
  } else {
    line += "finished collective " + std::to_string(r.finished);
    if (r.since_finished_s) line += " " + duration_text(*r.since_finished_s) + " ago";
    line += "; not in a collective";
  }
  if (r.p2p) line += " [waiting in " + p2p_text(*r.p2p) + "]";
  if (r.unrecorded > 0) {
    line += " [" + std::to_string(r.unrecorded) + " collective" + (r.unrecorded == 1 ? "" : "s") +
            " unrecorded: issued from a signal handler while it recorded]";
  }
  if (!r.running) line += " [exited: " + r.exit_text + "]";
  if (r.failed) line += " [a collective failed]";
  return line;
}

// Why a rank never entered collective k, after "never entered it".
std::string absence_text(const RankView& r) {
  std::string text;
  if (r.finished == 0) {
    text = "it has finished no collective yet";
  } else {
    text = "its last finished collective is " + std::to_string(r.finished);
    if (r.since_finished_s) text += ", " + duration_text(*r.since_finished_s) + " ago";
  }
  if (!r.running) text += "; it exited (" + r.exit_text + ")";
  return text;
}

using Calls = std::vector<std::pair<CollectiveInfo, std::vector<int>>>;

// "ranks 0-2 called all_reduce of ...; rank 3 called ...", blaming all but the largest group;
// past kDesyncCallsShown calls, the rest are counted, not spelled out.
std::string desync_text(const Calls& calls, CollectiveDiagnosis& d) {
  std::size_t largest = 0;
  for (std::size_t i = 1; i < calls.size(); ++i) {
    if (calls[i].second.size() > calls[largest].second.size()) largest = i;
  }
  std::string text;
  std::size_t shown = 0, hidden_calls = 0;
  std::vector<int> hidden_ranks;
  for (std::size_t i = 0; i < calls.size(); ++i) {
    if (i != largest) {
      d.blamed.insert(d.blamed.end(), calls[i].second.begin(), calls[i].second.end());
    }
    if (i != largest && shown + 1 >= kDesyncCallsShown) {
      ++hidden_calls;
      hidden_ranks.insert(hidden_ranks.end(), calls[i].second.begin(), calls[i].second.end());
      continue;
    }
    ++shown;
    text += (text.empty() ? "" : "; ") + plural_ranks(calls[i].second) + " called " +
            signature_text(calls[i].first);
  }
  if (hidden_calls > 0) {
    text += "; " + plural_ranks(hidden_ranks) + " called it in " + std::to_string(hidden_calls) +
            " other ways";
  }
  return text;
}

// "; rank 2 (host node-a, pid 4242) never entered it: ..." for a few ranks; for many, how
// many, which (short form), and the first of them described.
std::string absent_text(const std::vector<RankView>& ranks, const std::vector<int>& absent) {
  auto view = [&](int rank) -> const RankView& {
    return *std::find_if(ranks.begin(), ranks.end(),
                         [&](const RankView& v) { return v.rank == rank; });
  };
  std::string text;
  if (absent.size() <= kAbsentRanksDescribed) {
    for (int rank : absent) {
      text += "; " + rank_who(view(rank)) + " never entered it: " + absence_text(view(rank));
    }
    return text;
  }
  const RankView& first = view(absent.front());
  return "; " + std::to_string(absent.size()) + " ranks never entered it (" + rank_list(absent) +
         "), among them " + rank_who(first) + ": " + absence_text(first);
}

// A headline longer than kHeadlineMaxBytes (long host names) is cut, and says so.
std::string capped(std::string headline) {
  static const std::string kCut = " [... cut]";
  if (headline.size() <= kHeadlineMaxBytes) return headline;
  headline.resize(kHeadlineMaxBytes - kCut.size());
  return headline + kCut;
}

// No rank waits: either every rank is between collectives, or the last one failed (libddp
// fails a collective on every rank when their calls differ): then who called it how.
CollectiveDiagnosis diagnose_failed(const std::vector<RankView>& ranks, CollectiveDiagnosis d) {
  std::optional<std::uint64_t> failed;
  for (const RankView& r : ranks) {
    if (r.attached && r.last && r.last->failed) {
      failed = std::min(failed.value_or(r.last->seq), r.last->seq);
    }
  }
  if (!failed) {
    d.headline = "no collective in flight: every recording rank has finished collective " +
                 std::to_string(*d.collective - 1) + " and not issued the next";
    return d;
  }
  d.collective = failed;
  Calls calls;
  std::vector<int> failed_on;
  for (const RankView& r : ranks) {
    if (!r.attached || !r.last || r.last->seq != *failed) continue;
    if (r.last->failed) failed_on.push_back(r.rank);
    auto same = std::find_if(calls.begin(), calls.end(),
                             [&](const auto& call) { return call.first.same_call(*r.last); });
    if (same == calls.end()) {
      calls.push_back({*r.last, {r.rank}});
    } else {
      same->second.push_back(r.rank);
    }
  }
  const std::string at = "collective " + std::to_string(*failed);
  if (calls.size() > 1) {
    d.desync = true;
    d.headline =
        at + " failed: its ranks called it differently (a desync): " + desync_text(calls, d);
  } else {
    d.headline =
        at + " (" + call_text(calls.front().first) + ") failed on " + plural_ranks(failed_on);
  }
  d.headline = capped(std::move(d.headline));
  return d;
}

// No rank waits in a collective, and some wait in a send or recv: who waits for whom. A peer
// is blamed (one that exited is then a certain hang) where the peer's number is a rank of the
// job: in the default group (lane 0).
CollectiveDiagnosis diagnose_p2p(const std::vector<RankView>& ranks, CollectiveDiagnosis d) {
  d.collective.reset();
  std::string text;
  std::size_t shown = 0, more = 0;
  for (const RankView& r : ranks) {
    if (!r.attached || !r.p2p) continue;
    if (shown == kAbsentRanksDescribed) {
      ++more;
      continue;
    }
    text += (text.empty() ? "" : "; ") + rank_who(r) + " has waited in " + p2p_text(*r.p2p);
    ++shown;
    if (r.lane == 0 && r.p2p->peer && *r.p2p->peer < static_cast<std::uint64_t>(ranks.size())) {
      d.blamed.push_back(static_cast<int>(*r.p2p->peer));
    }
  }
  if (more > 0) text += "; " + std::to_string(more) + " more ranks wait in a send or recv";
  d.headline = capped("a point-to-point wait: " + text);
  return d;
}

}  // namespace

std::string rank_list(std::vector<int> ranks, std::size_t max_runs) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  std::string text;
  std::size_t runs = 0;
  for (std::size_t i = 0; i < ranks.size();) {
    if (runs == max_runs) return text + " and " + std::to_string(ranks.size() - i) + " more";
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!text.empty()) text += ", ";
    text += std::to_string(ranks[i]);
    if (j > i) text += (j == i + 1 ? ", " : "-") + std::to_string(ranks[j]);
    i = j + 1;
    ++runs;
  }
  return text;
}

std::string byte_text(std::uint64_t bytes) {
  char text[32];
  if (bytes < 1024) {
    std::snprintf(text, sizeof text, "%llu B", static_cast<unsigned long long>(bytes));
  } else if (bytes < (1ull << 20)) {
    std::snprintf(text, sizeof text, "%.1f KiB", static_cast<double>(bytes) / 1024.0);
  } else if (bytes < (1ull << 30)) {
    std::snprintf(text, sizeof text, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  } else {
    std::snprintf(text, sizeof text, "%.1f GiB", static_cast<double>(bytes) / (1 << 30));
  }
  return text;
}

std::string duration_text(double seconds) {
  char text[32];
  std::snprintf(text, sizeof text, seconds >= 10 ? "%.0f s" : "%.1f s", seconds);
  return text;
}

CollectiveDiagnosis diagnose(std::vector<RankView> ranks, bool rank_lines) {
  std::sort(ranks.begin(), ranks.end(),
            [](const RankView& a, const RankView& b) { return a.rank < b.rank; });
  CollectiveDiagnosis d;
  std::optional<std::uint64_t> lowest;
  for (const RankView& r : ranks) {
    if (r.attached) lowest = std::min(lowest.value_or(r.finished), r.finished);
  }
  if (!lowest) {
    for (const RankView& r : ranks) {
      if (rank_lines) d.ranks.push_back(rank_line(r, 0));
    }
    return d;
  }
  const std::uint64_t k = *lowest + 1;
  d.collective = k;
  for (const RankView& r : ranks) {
    if (rank_lines) d.ranks.push_back(rank_line(r, k));
  }

  // Who entered collective k (and with which call), who never did.
  std::vector<int> waiting, absent;
  std::vector<std::pair<CollectiveInfo, std::vector<int>>> calls;  // in order of first rank
  double waited = 0;
  auto add_call = [&calls](const CollectiveInfo& call, int rank) {
    auto same = std::find_if(calls.begin(), calls.end(),
                             [&](const auto& c) { return c.first.same_call(call); });
    if (same == calls.end()) {
      calls.push_back({call, {rank}});
    } else {
      same->second.push_back(rank);
    }
  };
  for (const RankView& r : ranks) {
    if (!r.attached) continue;
    if (r.finished >= k) {
      // It got through collective k already (perhaps failing, as a rank whose backend saw
      // the mismatch first): how it called it still counts for a desync.
      if (r.last && r.last->seq == k) add_call(*r.last, r.rank);
      continue;
    }
    if (r.queued < k) {
      absent.push_back(r.rank);
      continue;
    }
    waiting.push_back(r.rank);
    if (!r.pending) continue;
    waited = std::max(waited, r.pending->age_s);
    add_call(*r.pending, r.rank);
  }
  const std::string at = "collective " + std::to_string(k);
  if (waiting.empty()) {
    if (std::any_of(ranks.begin(), ranks.end(), [](const RankView& r) { return r.p2p; })) {
      return diagnose_p2p(ranks, std::move(d));
    }
    return diagnose_failed(ranks, std::move(d));
  }
  std::vector<int> lagging;  // ranks whose numbers may lag: they left collectives unrecorded
  for (const RankView& r : ranks) {
    if (r.attached && r.unrecorded > 0) lagging.push_back(r.rank);
  }
  if (calls.size() > 1 && !lagging.empty()) {
    // Not a desync that ddprun can be sure of: the odd calls may be the same call under
    // another number.
    d.headline = at + ": its ranks' records differ, but " + plural_ranks(lagging) +
                 " left collectives unrecorded (issued from a signal handler), so " +
                 (lagging.size() == 1 ? "its" : "their") + " numbers lag: not judged a desync; " +
                 plural_ranks(waiting) + (waiting.size() == 1 ? " has" : " have") + " waited for " +
                 duration_text(waited);
  } else if (calls.size() > 1) {
    d.desync = true;
    d.headline = at + ": its ranks called it differently (a desync): " + desync_text(calls, d);
  } else {
    d.headline = at;
    if (!calls.empty()) d.headline += " (" + call_text(calls.front().first) + ")";
    d.headline += ": " + plural_ranks(waiting) + (waiting.size() == 1 ? " has" : " have") +
                  " waited in it for " + duration_text(waited);
  }
  d.headline += absent_text(ranks, absent);
  d.blamed.insert(d.blamed.end(), absent.begin(), absent.end());
  if (absent.empty() && !d.desync) {
    d.headline += "; every rank entered it (none is missing: a lost peer or a network fault?)";
  }
  d.headline = capped(std::move(d.headline));
  return d;
}

namespace {

// judge_hang over one communicator's views.
std::optional<CollectiveDiagnosis> judge_lane(const std::vector<RankView>& ranks,
                                              double hang_timeout_s, bool rank_lines) {
  bool stuck = false;
  for (const RankView& r : ranks) {
    if (!r.attached) continue;
    if (r.since_finished_s && *r.since_finished_s < hang_timeout_s) return std::nullopt;
    if (r.running && r.pending && !r.pending->finished && r.pending->age_s >= hang_timeout_s) {
      stuck = true;
    }
    if (r.running && r.p2p && r.p2p->age_s >= hang_timeout_s) stuck = true;
  }
  if (!stuck) return std::nullopt;
  return diagnose(ranks, rank_lines);
}

// "communicator 2 (nccl)": the name of lane `lane` as its first recording rank gives it.
std::string lane_name(const std::vector<RankView>& views) {
  for (const RankView& v : views) {
    if (v.attached) return communicator_name(v);
  }
  return "another communicator";
}

}  // namespace

std::optional<CollectiveDiagnosis> judge_hang(const std::vector<RankView>& ranks,
                                              double hang_timeout_s, bool rank_lines) {
  // Each communicator on its own: lane i of every rank is the same communicator.
  if (auto d = judge_lane(ranks, hang_timeout_s, rank_lines)) {
    d->headline = capped("the job hung at " + d->headline);
    return d;
  }
  for (std::uint64_t key : extra_communicators(ranks)) {
    const std::vector<RankView> views = communicator_views(ranks, key);
    if (auto d = judge_lane(views, hang_timeout_s, rank_lines)) {
      d->headline = capped("the job hung in " + lane_name(views) + " at " + d->headline);
      return d;
    }
  }
  return std::nullopt;
}

std::vector<std::pair<std::string, CollectiveDiagnosis>> diagnose_lanes(
    const std::vector<RankView>& ranks) {
  std::vector<std::pair<std::string, CollectiveDiagnosis>> all;
  for (std::uint64_t key : extra_communicators(ranks)) {
    std::vector<RankView> views = communicator_views(ranks, key);
    std::string name = lane_name(views);
    all.emplace_back(std::move(name), diagnose(std::move(views)));
  }
  return all;
}

}  // namespace ddp::launcher
