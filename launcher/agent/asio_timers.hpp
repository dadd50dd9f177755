#pragma once
// AgentTimers on the agent's Boost.Asio loop: steady_timers, the steady clock. Internal.

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <map>

#include "agent/agent_timers.hpp"

namespace ddp::launcher {

class AsioTimers : public AgentTimers {
 public:
  explicit AsioTimers(boost::asio::io_context& io) : io_(io) {}

  Clock::time_point now() const override { return Clock::now(); }
  void start(TimerId id, std::chrono::milliseconds after, std::function<void()> on_expiry) override;
  void cancel(TimerId id) override;

 private:
  boost::asio::io_context& io_;
  std::map<TimerId, boost::asio::steady_timer> timers_;
  std::map<TimerId, unsigned> generation_;  // a completion queued before a cancel is stale
};

}  // namespace ddp::launcher
