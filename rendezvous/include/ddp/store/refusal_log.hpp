#pragma once
// Which refused connections get a log line: the first from an address, then at most one per
// address per window, saying how many more were refused since its last line. A peer that
// retries in a loop costs one line a minute, not one per attempt. Pure: the caller passes the
// time. Single-threaded (the server's loop).

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <unordered_map>

namespace ddp::store {

class RefusalLog {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::seconds kDefaultWindow{60};
  // Addresses remembered at most; past it the ones whose window ended are forgotten, and if
  // none has, all are (an address then gets a line again).
  static constexpr std::size_t kMaxAddresses = 4096;

  explicit RefusalLog(std::chrono::milliseconds window = kDefaultWindow) : window_(window) {}

  // A connection from peer (its address as text) was refused at now for why. Returns the line
  // to log, or nullopt when this address had a line less than a window ago.
  std::optional<std::string> refused(const std::string& peer, const std::string& why,
                                     Clock::time_point now);

 private:
  struct Entry {
    Clock::time_point last_line;
    std::size_t unlogged = 0;  // refused since last_line without a line
  };
  void forget_old(Clock::time_point now);

  std::chrono::milliseconds window_;
  std::unordered_map<std::string, Entry> entries_;
};

}  // namespace ddp::store
