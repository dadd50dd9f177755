#include "agent/asio_timers.hpp"

namespace ddp::launcher {

void AsioTimers::start(TimerId id, std::chrono::milliseconds after,
                       std::function<void()> on_expiry) {
  auto [it, inserted] = timers_.try_emplace(id, io_);
  const unsigned generation = ++generation_[id];
  it->second.expires_after(after);
  it->second.async_wait(
      [this, id, generation, on_expiry = std::move(on_expiry)](boost::system::error_code ec) {
        if (!ec && generation_[id] == generation) on_expiry();
      });
}

void AsioTimers::cancel(TimerId id) {
  ++generation_[id];
  auto it = timers_.find(id);
  if (it != timers_.end()) it->second.cancel();
}

}  // namespace ddp::launcher
