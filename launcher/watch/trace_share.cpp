#include "watch/trace_share.hpp"

#include <time.h>

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "ddp/store/client.hpp"
#include "ddp/store/server.hpp"
#include "watch/workers_store_client.hpp"

namespace ddp::launcher {
namespace {

// A store value holds at most 8 MiB (store::Limits): larger traces go in pieces.
constexpr std::size_t kChunkBytes = 4 * 1024 * 1024;

std::int64_t now_ns() {
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<std::int64_t>(now.tv_sec) * 1000000000LL + now.tv_nsec;
}

std::string key(int round, int group_rank) {
  return "ddprun/trace/" + std::to_string(round) + "/" + std::to_string(group_rank);
}

}  // namespace

ClockEstimate estimate_clock(store::Store& store, int samples) {
  ClockEstimate best;
  std::int64_t best_round_trip = std::numeric_limits<std::int64_t>::max();
  for (int i = 0; i < samples; ++i) {
    const std::int64_t sent = now_ns();
    const std::int64_t theirs = store.add(store::kClockKey, 0);
    const std::int64_t received = now_ns();
    if (theirs <= 0) {  // a store that counts: 0 (its value was kept, and must go)
      store.delete_key(store::kClockKey);
      throw std::runtime_error(
          "the workers' store does not read out its host's clock (it is not served by a "
          "ddprun agent)");
    }
    if (received - sent < best_round_trip) {
      best_round_trip = received - sent;
      best.offset_ns = theirs - (sent + (received - sent) / 2);
      best.uncertainty_ns = best_round_trip / 2;
    }
  }
  return best;
}

bool send_trace(const elastic::RoundInfo& round, const LocalTrace& trace) {
  store::Client client = connect_workers_store(round, kTraceShareTimeout);
  const ClockEstimate clock = estimate_clock(client);
  const std::string base = key(round.round, round.group_rank);
  // Each node's share of what the host may hold: past it, the trace stays on this node.
  const bool fits =
      trace.json.size() <= kMaxGatheredTrace / std::max<std::size_t>(round.members.size(), 1);
  std::size_t chunks = 0;
  for (std::size_t at = 0; fits && at < trace.json.size(); at += kChunkBytes, ++chunks) {
    client.set(base + "/" + std::to_string(chunks), trace.json.substr(at, kChunkBytes));
  }
  // The header last: once it is there, every piece is.
  const nlohmann::json header = {
      {"chunks", chunks},
      {"kept_locally", !fits},
      {"host", trace.host},
      {"origin_ref_ns", static_cast<std::int64_t>(trace.origin_ns) + clock.offset_ns},
      {"offset_ns", clock.offset_ns},
      {"uncertainty_ns", clock.uncertainty_ns}};
  client.set(base, header.dump());
  return fits;
}

GatheredTrace gather_traces(const elastic::RoundInfo& round, const LocalTrace& trace,
                            std::chrono::milliseconds timeout) {
  store::Client client = connect_workers_store(round, kTraceShareTimeout);
  const ClockEstimate clock = estimate_clock(client);
  GatheredTrace gathered;
  NodeTrace own;
  own.group_rank = round.group_rank;
  own.host = trace.host;
  own.json = trace.json;
  own.origin_ref_ns = static_cast<std::int64_t>(trace.origin_ns) + clock.offset_ns;
  own.offset_ns = clock.offset_ns;
  own.uncertainty_ns = clock.uncertainty_ns;
  std::size_t gathered_bytes = own.json.size();
  gathered.nodes.push_back(std::move(own));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (int g = 0; g < static_cast<int>(round.members.size()); ++g) {
    if (g == round.group_rank) continue;
    const std::string base = key(round.round, g);
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    try {
      client.wait({base}, std::max(left, std::chrono::milliseconds(1)));
    } catch (const store::StoreTimeout&) {
      gathered.missing.push_back(g);
      continue;
    }
    const nlohmann::json header = nlohmann::json::parse(client.get(base));
    NodeTrace node;
    node.group_rank = g;
    node.host = header.value("host", "");
    node.origin_ref_ns = header.at("origin_ref_ns").get<std::int64_t>();
    node.offset_ns = header.value("offset_ns", std::int64_t{0});
    node.uncertainty_ns = header.value("uncertainty_ns", std::int64_t{0});
    const auto chunks = header.at("chunks").get<std::size_t>();
    if (header.value("kept_locally", false) ||
        gathered_bytes + chunks * kChunkBytes > kMaxGatheredTrace) {  // the host's memory
      gathered.left_out.push_back(g);
      continue;
    }
    for (std::size_t i = 0; i < chunks; ++i)
      node.json += client.get(base + "/" + std::to_string(i));
    gathered_bytes += node.json.size();
    gathered.nodes.push_back(std::move(node));
  }
  gathered.json = merge_traces(gathered.nodes);
  return gathered;
}

}  // namespace ddp::launcher
