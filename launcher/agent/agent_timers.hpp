#pragma once
// The agent's clock and timers, behind a narrow interface so that the state machine's tests
// move time by hand. The real one runs steady_timers on the agent's loop.

#include <chrono>
#include <functional>

namespace ddp::launcher {

enum class TimerId {
  kKill,   // SIGKILL what is left of a stopping group (--shutdown_timeout)
  kDrain,  // stop waiting for the last teed output
  kGrace,  // stop waiting for the reason of a round the exit barrier reported stopped
  kAbort,  // a hung job's NCCL ranks had their time to abort by themselves: SIGTERM
};

class AgentTimers {
 public:
  using Clock = std::chrono::steady_clock;
  virtual ~AgentTimers() = default;
  virtual Clock::time_point now() const = 0;
  // (Re)starts timer id: on_expiry is called on the agent's loop after `after`, unless the
  // timer is cancelled or started again first.
  virtual void start(TimerId id, std::chrono::milliseconds after,
                     std::function<void()> on_expiry) = 0;
  virtual void cancel(TimerId id) = 0;
};

}  // namespace ddp::launcher
