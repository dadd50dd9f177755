#include "ddp/elastic/heartbeat_monitor.hpp"

namespace ddp::elastic {

void HeartbeatMonitor::observe(const std::string& node_id, std::int64_t counter,
                               Clock::time_point now) {
  auto [it, inserted] = seen_.try_emplace(node_id, Seen{counter, now});
  if (!inserted && it->second.counter != counter) it->second = Seen{counter, now};
}

std::vector<std::string> HeartbeatMonitor::stale(const std::vector<std::string>& node_ids,
                                                 Clock::time_point now) const {
  std::vector<std::string> dead;
  for (const auto& id : node_ids) {
    auto it = seen_.find(id);
    if (it != seen_.end() && now - it->second.changed >= budget_) dead.push_back(id);
  }
  return dead;
}

}  // namespace ddp::elastic
