#pragma once
// Where a store client connects and how long it waits: shared by Client and AsyncClient.

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "ddp/store/store.hpp"
#include "ddp/store/wire_codec.hpp"

namespace ddp::store {

// How long a new client keeps trying to reach its server by default.
inline constexpr std::chrono::milliseconds kDefaultConnectTimeout = std::chrono::seconds(60);
// How long detect_dialect waits for a 1.x reply by default.
inline constexpr std::chrono::milliseconds kDefaultProbeTimeout = std::chrono::milliseconds(1000);

struct ClientOptions {
  std::string host = "127.0.0.1";
  std::uint16_t port = 29500;
  // V2 (default), V1 for a PyTorch 1.x server, or nullopt to probe with detect_dialect()
  // (Client only; an AsyncClient needs to be told).
  std::optional<Dialect> dialect = Dialect::V2;
  std::chrono::milliseconds connect_timeout = kDefaultConnectTimeout;
  std::chrono::milliseconds timeout = kDefaultTimeout;  // waits, gets and each whole reply
  Limits limits;  // the largest value (and MULTI_GET reply) accepted in a reply
};

}  // namespace ddp::store
