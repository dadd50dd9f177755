#include "store_session.hpp"

#include <algorithm>
#include <cstdio>
#include <thread>

#include "ddp/common/retry_pause.hpp"
#include "ddp/elastic/state_backend.hpp"

namespace ddp::elastic {

namespace {

std::unique_ptr<RunBackend> backend_of(const RendezvousSettings& settings) {
  if (settings.backend == "etcd" || settings.backend == "etcd-v2") {
    return make_etcd_backend(settings);
  }
  return make_store_backend(settings);
}

}  // namespace

StoreSession::StoreSession(RendezvousSettings s)
    : settings(std::move(s)),
      rules(rules_of(settings)),
      backend(backend_of(settings)),
      keys(backend->keys()),
      endpoint(backend->where()) {}

std::unique_ptr<store::Store> StoreSession::connect(Clock::time_point deadline) const {
  const auto start = Clock::now();
  std::optional<Clock::time_point> next_notice;
  const std::string what = settings.backend == "etcd" || settings.backend == "etcd-v2"
                               ? endpoint  // "etcd at H:P,..."
                               : "the rendezvous store at " + endpoint;
  auto on_failure = [&](const std::string& error) {
    const auto now = Clock::now();
    if (cancel.load() || (next_notice && now < *next_notice)) return;  // left: nothing to say
    next_notice = now + settings.wait_notice_interval;
    using std::chrono::seconds;
    const auto waited = std::chrono::duration_cast<seconds>(now - start).count();
    const auto left = std::chrono::ceil<seconds>(deadline - now).count();
    notice("ddprun: waiting for " + what + " (" + std::to_string(waited) +
           " s so far, giving up in " + std::to_string(std::max<long long>(left, 0)) +
           " s): " + error);
  };
  return backend->connect(deadline, cancel, on_failure);
}

std::chrono::milliseconds heartbeat_budget(const RendezvousTimeouts& timeouts) {
  return timeouts.keep_alive * std::max(1, timeouts.keep_alive_max_attempt);
}

std::chrono::milliseconds StoreSession::heartbeat_budget() const {
  return elastic::heartbeat_budget(settings.timeouts);
}

std::chrono::milliseconds StoreSession::slice() const {
  return std::clamp(settings.timeouts.keep_alive, std::chrono::milliseconds(1), kMaxWaitSlice);
}

std::optional<RoundState> StoreSession::modify(
    store::Store& store,
    const std::function<std::optional<RoundState>(const std::optional<RoundState>&)>& change)
    const {
  StoreStateBackend backend(store, keys.state());
  auto read = backend.get_state();
  while (true) {
    std::optional<RoundState> state;
    if (read) state = decode_state(read->bytes);
    auto next = change(state);
    if (!next) return std::nullopt;
    std::optional<std::string> token;
    if (read) token = read->token;
    auto written = backend.set_state(encode_state(*next), token);
    if (written.won) return next;
    read = StateBackend::Read{written.bytes, written.token};
  }
}

RoundEnd StoreSession::end_round(store::Store& store, int round, const RoundEnd& end) const {
  return decode_end(store.compare_set(keys.end(round), "", encode_end(end)));
}

std::unique_ptr<store::Store> connect_with_retries(
    Clock::time_point deadline, const std::atomic<bool>& cancel,
    const std::function<void(const std::string&)>& on_failure, std::chrono::milliseconds pause,
    const std::function<std::unique_ptr<store::Store>()>& attempt,
    const std::function<std::string(std::chrono::milliseconds tried, const std::string& error)>&
        give_up) {
  const auto start = Clock::now();
  std::string last_error = "no attempt made";
  while (true) {
    if (cancel.load()) throw Cancelled{};
    bool busy = false;  // it answered, just not in time
    try {
      return attempt();
    } catch (const store::StoreTimeout& e) {
      last_error = e.what();
      busy = true;
    } catch (const store::StoreError& e) {
      last_error = e.what();
    }
    // A refusal is said at once; a store that is only slow to answer (a thousand agents
    // connecting at once) is given kBusyGrace before a line says so.
    if (on_failure && (!busy || Clock::now() - start >= kBusyGrace)) on_failure(last_error);
    if (Clock::now() >= deadline) break;
    if (pause.count() > 0) std::this_thread::sleep_for(pause);
  }
  const auto tried = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
  throw RendezvousError(give_up(tried, last_error));
}

std::string seconds_text(std::chrono::milliseconds duration) {
  char text[32];
  double seconds = static_cast<double>(duration.count()) / 1000.0;
  if (seconds >= 10 || duration.count() % 1000 == 0) {
    std::snprintf(text, sizeof text, "%.0f s", seconds);
  } else {
    std::snprintf(text, sizeof text, "%.1f s", seconds);
  }
  return text;
}

}  // namespace ddp::elastic
