#pragma once
// --trace_file on a job of several nodes: one file for the whole job, written by the agent of
// group rank 0. At the end every other agent estimates its clock's offset to the workers'
// store host (that store, served by an agent, answers an ADD to store::kClockKey with its
// CLOCK_MONOTONIC)
// and puts its trace there, under ddprun/trace/<round>/<group rank>; the writer estimates its
// own offset the same way, waits for the others' (bounded), and merges them onto that clock.
// Blocking, and the writer's store may be served by its own loop: call off the agent's loop.
// Internal to the launcher.

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "ddp/elastic/rendezvous.hpp"
#include "ddp/store/store.hpp"
#include "diagnosis/trace_merge.hpp"

namespace ddp::launcher {

// The most trace JSON the host gathers from all nodes (in its store and in the merge): a node
// whose trace is larger than its share (this / nodes) writes it on its own disk instead.
inline constexpr std::size_t kMaxGatheredTrace = 512u * 1024 * 1024;

// How long the writer waits for the other nodes' traces, and one store call may take.
inline constexpr std::chrono::milliseconds kTraceShareTimeout{10000};

struct ClockEstimate {
  std::int64_t offset_ns = 0;       // the store host's clock - ours
  std::int64_t uncertainty_ns = 0;  // half the shortest round trip: the offset is within this
};

// Reads the store host's clock `samples` times; keeps the reading with the shortest round
// trip. Throws std::runtime_error when the store does not serve a clock (not an agent's).
ClockEstimate estimate_clock(store::Store& store, int samples = 16);

// This node's trace, as shared: its JSON, its ts 0 on its own clock, and where it comes from.
struct LocalTrace {
  std::string json;
  std::uint64_t origin_ns = 0;  // CLOCK_MONOTONIC of its ts 0
  std::string host;
};

// A node other than group rank 0: sends its trace to round's workers' store. Throws on failure
// (the caller writes its trace on its own then).
// False when the trace is larger than this node's share of kMaxGatheredTrace (the host's
// bound): then only a header saying so is sent, and the caller writes the trace itself.
bool send_trace(const elastic::RoundInfo& round, const LocalTrace& trace);

struct GatheredTrace {
  std::string json;              // the merged trace
  std::vector<NodeTrace> nodes;  // those merged, this one first
  std::vector<int> missing;      // group ranks whose trace did not come in time
  std::vector<int> left_out;     // group ranks not merged: their trace stayed on their node
};

// Group rank 0: its own trace and the others', merged. Throws when the store cannot be used.
GatheredTrace gather_traces(const elastic::RoundInfo& round, const LocalTrace& trace,
                            std::chrono::milliseconds timeout = kTraceShareTimeout);

}  // namespace ddp::launcher
