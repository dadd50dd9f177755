#pragma once
// Decides which nodes are dead from their heartbeat counters, on the observer's own steady
// clock: a node is stale when its counter has not changed for the whole budget
// (keep_alive_interval x keep_alive_max_attempt) since this observer first saw it. No clock
// is ever compared across nodes. Pure value type: the driver feeds it counters it read.

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ddp::elastic {

class HeartbeatMonitor {
 public:
  using Clock = std::chrono::steady_clock;

  explicit HeartbeatMonitor(Clock::duration budget) : budget_(budget) {}

  // Records the counter read for node_id at `now`.
  void observe(const std::string& node_id, std::int64_t counter, Clock::time_point now);

  // The ids among `node_ids` whose counter did not change for the budget. A node never
  // observed is not stale.
  std::vector<std::string> stale(const std::vector<std::string>& node_ids,
                                 Clock::time_point now) const;

  Clock::duration budget() const { return budget_; }

 private:
  struct Seen {
    std::int64_t counter = 0;
    Clock::time_point changed;  // when this observer first saw `counter`
  };
  Clock::duration budget_;
  std::map<std::string, Seen> seen_;
};

}  // namespace ddp::elastic
