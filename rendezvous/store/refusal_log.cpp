#include "ddp/store/refusal_log.hpp"

namespace ddp::store {

std::optional<std::string> RefusalLog::refused(const std::string& peer, const std::string& why,
                                               Clock::time_point now) {
  auto it = entries_.find(peer);
  if (it != entries_.end() && now - it->second.last_line < window_) {
    ++it->second.unlogged;
    return std::nullopt;
  }
  std::string line = "refused a connection from " + peer + ": " + why;
  if (it != entries_.end() && it->second.unlogged > 0) {
    line += " (and " + std::to_string(it->second.unlogged) + " more from it since its last line)";
  }
  if (it == entries_.end()) {
    if (entries_.size() >= kMaxAddresses) forget_old(now);
    it = entries_.emplace(peer, Entry{}).first;
  }
  it->second = Entry{now, 0};
  return line;
}

void RefusalLog::forget_old(Clock::time_point now) {
  std::erase_if(entries_, [&](const auto& item) { return now - item.second.last_line >= window_; });
  if (entries_.size() >= kMaxAddresses) entries_.clear();
}

}  // namespace ddp::store
