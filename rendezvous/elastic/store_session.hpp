#pragma once
// What every thread of the rendezvous engine shares: the settings, the backend (a c10d store
// or etcd), the run's keys, the cancellation flag, and the ways to reach the state and change
// it. Private to rendezvous/elastic/.

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "ddp/elastic/rendezvous.hpp"
#include "ddp/elastic/round_state.hpp"
#include "ddp/store/store.hpp"
#include "run_backend.hpp"
#include "run_keys.hpp"

namespace ddp::elastic {

using Clock = std::chrono::steady_clock;

// Thrown inside the engine's threads once the handler is being destroyed or left: the task
// ends without calling back.
struct Cancelled {};

// How long one store connection attempt may take before the cancel flag is looked at again.
inline constexpr std::chrono::milliseconds kConnectSlice = std::chrono::seconds(1);
// The longest single WAIT: bounds how late a thread notices cancellation.
inline constexpr std::chrono::milliseconds kMaxWaitSlice = std::chrono::seconds(1);

struct StoreSession {
  explicit StoreSession(RendezvousSettings s);

  RendezvousSettings settings;
  RoundRules rules;
  std::unique_ptr<RunBackend> backend;  // chosen by settings.backend
  RunKeys keys;
  std::string endpoint;  // where the state lives, for messages (backend->where())
  std::atomic<bool> cancel{false};

  // keep_alive_interval x keep_alive_max_attempt: when a silent node counts as dead.
  std::chrono::milliseconds heartbeat_budget() const;
  // One WAIT slice: keep_alive_interval, at most kMaxWaitSlice.
  std::chrono::milliseconds slice() const;

  void check_cancel() const {
    if (cancel.load()) throw Cancelled{};
  }

  // A connection for one engine thread, retrying with back-off until deadline; then a
  // RendezvousError naming where the state lives, how long it tried and the last error.
  // While it retries, a notice names the backend and the last error: at the first failure,
  // then every settings.wait_notice_interval.
  std::unique_ptr<store::Store> connect(Clock::time_point deadline) const;
  // Sends a line to the console, when the agent gave a way to.
  void notice(const std::string& line) const {
    if (settings.notice) settings.notice(line);
  }

  // Reads the state, applies change (empty result: nothing to write) and writes it back with
  // compare-and-set, again until it wins. Returns the state written, or empty.
  std::optional<RoundState> modify(
      store::Store& store,
      const std::function<std::optional<RoundState>(const std::optional<RoundState>&)>& change)
      const;

  // Sets round r's end unless one is set already; returns the end that won.
  RoundEnd end_round(store::Store& store, int round, const RoundEnd& end) const;
};

// "12 s", "1.5 s"
std::string seconds_text(std::chrono::milliseconds duration);

// The backends' connect() loop: attempt() until it returns a store, `pause` between failed
// attempts. A StoreError is a failed attempt (its text goes to on_failure, which may be
// empty; a StoreTimeout's only once the attempts have failed for 5 s: a store slow to answer
// is busy, not gone); anything else attempt() throws ends the loop at once. Cancelled when cancel
// is set; past the deadline a RendezvousError of give_up(how long it tried, the last error).
std::unique_ptr<store::Store> connect_with_retries(
    Clock::time_point deadline, const std::atomic<bool>& cancel,
    const std::function<void(const std::string&)>& on_failure, std::chrono::milliseconds pause,
    const std::function<std::unique_ptr<store::Store>()>& attempt,
    const std::function<std::string(std::chrono::milliseconds tried, const std::string& error)>&
        give_up);

// keep_alive_interval x keep_alive_max_attempt: when a silent node counts as dead.
std::chrono::milliseconds heartbeat_budget(const RendezvousTimeouts& timeouts);

}  // namespace ddp::elastic
