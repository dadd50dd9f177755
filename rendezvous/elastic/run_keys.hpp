#pragma once
// The keys of one run, all under /ddprun/<run_id>/ so that runs never mix (on etcd, the
// connection adds that prefix itself and the keys are relative to it):
//   state              the RoundState as JSON, changed only with compare-and-set
//   hb/<node_id>       the node is alive: a counter it ADDs 1 to every keep_alive_interval
//                      (store), or a key bound to its lease (etcd)
//   round_<r>/closed   SET once round r closed (joiners WAIT on it)
//   round_<r>/end      how running round r ended, first writer wins (compare_set from ""):
//                      a StopReason, or {"finished":true} once the exit barrier passed
//   round_<r>/done/<node_id>  exit barrier: set by each member whose workers succeeded (one
//                      key per node, never a counter: setting it twice counts once)
//   round_<r>/arrived  exit barrier: a counter each member ADDs 1 to after its done key; a
//                      hint of when to look at the keys, never the count itself
//   round_<r>/queue    open round r's joiners, one JSON Participant a line (APPEND), which the
//                      round's tender adds to the state (so that N joiners are not N racing
//                      compare-and-sets of a state of N nodes)
//   round_<r>/queued   a counter each joiner ADDs 1 to after its APPEND: tells the tender,
//                      in a few bytes, that the queue grew
//   round_<r>/opener  the member of round r-1 that opens round r (compare_set from "", first
//                      writer wins); the other members queue into round r at once, without
//                      reading the state
//   round_<r>/rejected/<node_id>  why the tender left a queued joiner out (static: its
//                      --node_rank is taken or out of range)

#include <charconv>
#include <string>
#include <string_view>

namespace ddp::elastic {

class RunKeys {
 public:
  // Where every run's keys live, under the store's root.
  static constexpr std::string_view kRoot = "/ddprun/";
  // "/ddprun/<run_id>/": where a run's keys live.
  static std::string run_prefix(const std::string& run_id) {
    return std::string(kRoot) + run_id + "/";
  }
  // Whether `key` is some run's state() under kRoot.
  static bool is_state(std::string_view key) {
    return key.starts_with(kRoot) && key.ends_with("/state");
  }
  // r when `key` is some run's closed(r) under kRoot, else 0.
  static int closed_round(std::string_view key) {
    constexpr std::string_view kClosed = "/closed", kRound = "/round_";
    if (!key.starts_with(kRoot) || !key.ends_with(kClosed)) return 0;
    key.remove_suffix(kClosed.size());
    const std::size_t at = key.rfind(kRound);
    if (at == std::string_view::npos || at < kRoot.size()) return 0;
    const std::string_view digits = key.substr(at + kRound.size());
    int round = 0;
    const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), round);
    return error == std::errc() && end == digits.data() + digits.size() ? round : 0;
  }
  // Keys that start with `prefix` (run_prefix(run_id), or "" where the store adds it).
  explicit RunKeys(std::string prefix) : prefix_(std::move(prefix)) {}

  std::string state() const { return prefix_ + "state"; }
  std::string heartbeats() const { return prefix_ + "hb/"; }  // every node's, by prefix
  std::string heartbeat(const std::string& node_id) const { return heartbeats() + node_id; }
  std::string closed(int round) const { return round_key(round, "closed"); }
  std::string end(int round) const { return round_key(round, "end"); }
  // The exit barrier's keys of round r, by prefix, and this node's.
  std::string done(int round) const { return round_key(round, "done/"); }
  std::string done(int round, const std::string& node_id) const { return done(round) + node_id; }
  std::string arrived(int round) const { return round_key(round, "arrived"); }
  std::string opener(int round) const { return round_key(round, "opener"); }
  std::string queue(int round) const { return round_key(round, "queue"); }
  std::string queued(int round) const { return round_key(round, "queued"); }
  std::string rejected(int round, const std::string& node_id) const {
    return round_key(round, "rejected/") + node_id;
  }

 private:
  std::string round_key(int round, const char* name) const {
    return prefix_ + "round_" + std::to_string(round) + "/" + name;
  }
  std::string prefix_;
};

}  // namespace ddp::elastic
