#include "store_session.hpp"

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/udp.hpp>
#include <cstdio>

#include "ddp/elastic/state_backend.hpp"

namespace ddp::elastic {

StoreSession::StoreSession(RendezvousSettings s)
    : settings(std::move(s)),
      rules(rules_of(settings)),
      keys(settings.run_id),
      endpoint(settings.store_host + ":" + std::to_string(settings.store_port)) {}

std::chrono::milliseconds StoreSession::heartbeat_budget() const {
  return settings.timeouts.keep_alive * std::max(1, settings.timeouts.keep_alive_max_attempt);
}

std::chrono::milliseconds StoreSession::slice() const {
  return std::clamp(settings.timeouts.keep_alive, std::chrono::milliseconds(1), kMaxWaitSlice);
}

store::ClientOptions StoreSession::client_options(std::chrono::milliseconds connect_timeout) const {
  store::ClientOptions options;
  options.host = settings.store_host;
  options.port = static_cast<std::uint16_t>(settings.store_port);
  options.dialect = store::Dialect::V2;
  options.connect_timeout = connect_timeout;
  options.timeout = settings.timeouts.read;
  return options;
}

std::unique_ptr<store::Client> StoreSession::connect(Clock::time_point deadline) const {
  auto start = Clock::now();
  std::string last_error = "no attempt made";
  while (true) {
    check_cancel();
    try {
      // Each attempt (and each later reconnect) tries for kConnectSlice, so that a dead store
      // is retried with back-off, never in a tight loop, and cancellation is seen in time.
      return std::make_unique<store::Client>(client_options(kConnectSlice));
    } catch (const store::StoreError& e) {
      last_error = e.what();
    }
    if (Clock::now() >= deadline) break;
  }
  auto tried = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
  throw RendezvousError("could not reach the rendezvous store at " + endpoint + " for " +
                        seconds_text(tried) + " (" + last_error +
                        "); is the agent of node 0 (the host of --master_addr or "
                        "--rdzv_endpoint) running, and is that address reachable from here?");
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

std::string local_address_towards(const std::string& host, int port) {
  try {
    boost::asio::io_context io;
    boost::asio::ip::udp::resolver resolver(io);
    auto endpoints = resolver.resolve(host, std::to_string(port));
    for (const auto& entry : endpoints) {
      boost::asio::ip::udp::socket socket(io);
      boost::system::error_code error;
      socket.open(entry.endpoint().protocol(), error);
      if (error) continue;
      socket.connect(entry.endpoint(), error);  // UDP: picks the route, sends nothing
      if (error) continue;
      return socket.local_endpoint().address().to_string();
    }
  } catch (const boost::system::system_error&) {
  }
  return {};
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
