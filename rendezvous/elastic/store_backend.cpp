// The static and c10d backends: the run's keys in a c10d store that one agent serves, nodes
// alive by heartbeat counters (run_backend.hpp).

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <thread>

#include "ddp/common/retry_pause.hpp"
#include "ddp/elastic/heartbeat_monitor.hpp"
#include "ddp/store/client.hpp"
#include "ddp/store/store_util.hpp"
#include "run_backend.hpp"
#include "store_session.hpp"

namespace ddp::elastic {
namespace {

// Reads the counters of the nodes it is asked about and calls a node dead when its counter
// did not move for the heartbeat budget, on this observer's own clock.
class CounterObserver final : public LivenessObserver {
 public:
  CounterObserver(RunKeys keys, std::chrono::milliseconds budget)
      : keys_(std::move(keys)), monitor_(budget) {}

  std::vector<std::string> dead(store::Store& store,
                                const std::vector<std::string>& node_ids) override {
    if (node_ids.empty()) return {};
    std::vector<std::string> keys;
    for (const auto& id : node_ids) keys.push_back(keys_.heartbeat(id));
    auto counters = store.multi_get(keys);
    auto now = Clock::now();
    for (std::size_t i = 0; i < node_ids.size(); ++i) {
      monitor_.observe(node_ids[i], store::parse_counter(counters[i]).value_or(0), now);
    }
    return monitor_.stale(node_ids, now);
  }

 private:
  RunKeys keys_;
  HeartbeatMonitor monitor_;
};

// A connection attempt after the first waits up to this long for the store's answer.
constexpr std::chrono::milliseconds kConnectLast{4000};
// The pause before the second attempt; it doubles with each (to 16 times this), and each
// is drawn between half and one and a half of that.
constexpr std::chrono::milliseconds kRetryPauseFirst{50};

// How long one connect of the refusal probe (lost_for_good) may take: a live host refuses in
// a round trip; and how long a connection it made must stay open to count as a live server.
constexpr std::chrono::milliseconds kRefusalProbe{1000};
constexpr std::chrono::milliseconds kAliveFor{300};

enum class Probe { kRefused, kAlive, kClosed, kUnknown };

// One TCP connect to one address, bounded: refused (ECONNREFUSED: the host's kernel answers,
// nothing listens), alive (connected, and the connection stays open for kAliveFor), closed
// (connected, then reset or closed at once: a listener whose process is being killed), or
// unknown (timed out, unreachable).
Probe probe_address(const addrinfo& a, std::chrono::milliseconds bound) {
  const int fd = ::socket(a.ai_family, a.ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return Probe::kUnknown;
  int error = 0;
  if (::connect(fd, a.ai_addr, a.ai_addrlen) != 0) {
    error = errno;
    if (error == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      error = ETIMEDOUT;
      if (::poll(&p, 1, static_cast<int>(bound.count())) == 1) {
        socklen_t size = sizeof error;
        if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size) != 0) error = errno;
      }
    }
  }
  Probe result = error == ECONNREFUSED ? Probe::kRefused : Probe::kUnknown;
  if (error == 0) {
    pollfd p{fd, POLLIN, 0};
    result =
        ::poll(&p, 1, static_cast<int>(kAliveFor.count())) == 0 ? Probe::kAlive : Probe::kClosed;
  }
  ::close(fd);
  return result;
}

// Whether host:port refuses connections for certain: every address refuses, or one closes
// the connections it accepts until it refuses (at most a few tries).
bool connection_refused(const std::string& host, int port, std::chrono::milliseconds bound) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) {
    return false;
  }
  bool refused = found != nullptr;
  for (addrinfo* a = found; a && refused; a = a->ai_next) {
    Probe probe = probe_address(*a, bound);
    for (int retry = 0; probe == Probe::kClosed && retry < 3; ++retry) {
      probe = probe_address(*a, bound);
    }
    refused = probe == Probe::kRefused;
  }
  ::freeaddrinfo(found);
  return refused;
}

class StoreBackend final : public RunBackend {
 public:
  explicit StoreBackend(const RendezvousSettings& settings)
      : settings_(settings),
        where_(settings.store_host + ":" + std::to_string(settings.store_port)) {}

  std::string where() const override { return where_; }
  RunKeys keys() const override { return RunKeys(RunKeys::run_prefix(settings_.run_id)); }

  std::unique_ptr<store::Store> connect(
      Clock::time_point deadline, const std::atomic<bool>& cancel,
      const std::function<void(const std::string&)>& on_failure) const override {
    // The first attempt tries for kConnectSlice, so that cancellation is seen in time; each
    // later one for twice as long, up to kConnectLast, after a pause with jitter: a store
    // host that is slow to answer (a thousand agents starting at once) is given the time it
    // needs instead of a new connection from every agent every second.
    int tries = 0;
    return connect_with_retries(
        deadline, cancel, on_failure, std::chrono::milliseconds(0),
        [this, &tries, &cancel]() -> std::unique_ptr<store::Store> {
          if (tries > 0) {
            std::this_thread::sleep_for(jittered(kRetryPauseFirst * (1 << std::min(tries - 1, 4))));
            if (cancel.load()) throw Cancelled{};
          }
          auto bound = std::min(kConnectSlice * (1 << std::min(tries, 2)), kConnectLast);
          ++tries;
          return std::make_unique<store::Client>(options(bound));
        },
        [this](std::chrono::milliseconds tried, const std::string& error) {
          return "could not reach the rendezvous store at " + where_ + " for " +
                 seconds_text(tried) + " (" + error +
                 "); is the agent of node 0 (the host of --master_addr or --rdzv_endpoint) "
                 "running, and is that address reachable from here?";
        });
  }

  // The round was formed through the store: a refusal now means its agent is gone, and ends
  // the wait at once. A store that is slow to answer is busy, not gone: every node of the
  // round connects its watcher as the round starts (a thousand at once, on a host starting its
  // own workers too), so the first connection waits as long as a store call may (read_timeout),
  // not only the heartbeat budget, which made a busy host look lost and re-formed the job again
  // and again at 1,000 agents (issue 49).
  std::unique_ptr<store::Store> connect_watcher(Clock::time_point deadline,
                                                const std::atomic<bool>& cancel) const override {
    deadline = std::max(deadline, Clock::now() + settings_.timeouts.read);
    return connect(deadline, cancel, [this](const std::string& error) {
      if (auto gone = lost_for_good(error)) throw RendezvousError(*gone);
    });
  }

  std::unique_ptr<store::Store> connect_once(std::chrono::milliseconds bound) const override {
    auto o = options(bound);
    o.timeout = std::min(o.timeout, bound);
    return std::make_unique<store::Client>(o);
  }

  void announce(store::Store& store, const std::string& node_id) override {
    store.add(keys().heartbeat(node_id), 1);
  }
  void beat(store::Store& store, const std::string& node_id) override {
    store.add(keys().heartbeat(node_id), 1);
  }
  void retire(store::Store&, const std::string&) override {}  // the counter just stops

  std::unique_ptr<LivenessObserver> observer() const override {
    return std::make_unique<CounterObserver>(keys(), heartbeat_budget(settings_.timeouts));
  }

  std::string dead_text() const override {
    const auto& t = settings_.timeouts;
    return "no heartbeat for " + seconds_text(heartbeat_budget(t)) + ": keep_alive_interval " +
           seconds_text(t.keep_alive) + " x keep_alive_max_attempt " +
           std::to_string(t.keep_alive_max_attempt);
  }

  std::chrono::milliseconds failure_budget() const override {
    return heartbeat_budget(settings_.timeouts);
  }

  std::string lost_text(const std::string& what) const override {
    return "lost the rendezvous store at " + where_ + ": " + what +
           "; did the agent hosting it (node 0, or the --rdzv_endpoint host) exit?";
  }

  std::optional<std::string> lost_for_good(const std::string& /*what*/) const override {
    if (!connection_refused(settings_.store_host, settings_.store_port, kRefusalProbe)) {
      return std::nullopt;
    }
    return "lost the rendezvous store at " + where_ +
           ": its host refuses connections, so the agent that served it (node 0, or the "
           "--rdzv_endpoint host) exited and the job's rendezvous state went with it";
  }

 private:
  store::ClientOptions options(std::chrono::milliseconds connect_timeout) const {
    store::ClientOptions o;
    o.host = settings_.store_host;
    o.port = static_cast<std::uint16_t>(settings_.store_port);
    o.dialect = store::Dialect::V2;
    o.connect_timeout = connect_timeout;
    o.timeout = settings_.timeouts.read;
    return o;
  }

  RendezvousSettings settings_;
  std::string where_;
};

}  // namespace

std::unique_ptr<RunBackend> make_store_backend(const RendezvousSettings& settings) {
  return std::make_unique<StoreBackend>(settings);
}

}  // namespace ddp::elastic
