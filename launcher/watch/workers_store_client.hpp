#pragma once
// A client of a round's workers' store: the store at the round's MASTER_ADDR:MASTER_PORT that
// every node's workers use, which agents also use to share what they saw (the collective
// views, the traces). Internal to the launcher.

#include <chrono>
#include <cstdint>
#include <optional>

#include "ddp/elastic/rendezvous.hpp"
#include "ddp/store/client.hpp"

namespace ddp::launcher {

// How to reach it: in whichever dialect the store speaks; the connect and every request
// bounded by timeout.
inline store::ClientOptions workers_store_options(const elastic::RoundInfo& round,
                                                  std::chrono::milliseconds timeout) {
  store::ClientOptions options;
  options.host = round.master_addr;
  options.port = static_cast<std::uint16_t>(round.master_port);
  options.dialect = std::nullopt;
  options.connect_timeout = timeout;
  options.timeout = timeout;
  return options;
}

// Connects (workers_store_options).
inline store::Client connect_workers_store(const elastic::RoundInfo& round,
                                           std::chrono::milliseconds timeout) {
  return store::Client(workers_store_options(round, timeout));
}

}  // namespace ddp::launcher
