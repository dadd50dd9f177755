#pragma once
// One Chrome Trace of a multi-node job from each node's (TraceEvents::json()): every node's
// events moved onto the reference clock (the CLOCK_MONOTONIC of the node whose agent serves
// the workers' store), each node's agent on a track of its own, the ranks' tracks shared.
// Pure JSON work. Internal to the launcher.

#include <cstdint>
#include <string>
#include <vector>

namespace ddp::launcher {

struct NodeTrace {
  int group_rank = 0;
  std::string host;
  std::string json;                 // TraceEvents::json() of that node
  std::int64_t origin_ref_ns = 0;   // its ts 0 on the reference clock (origin + offset)
  std::int64_t offset_ns = 0;       // reference clock - its clock
  std::int64_t uncertainty_ns = 0;  // half the shortest round trip of the estimate
};

// nodes[0] is the writing node (group rank 0); its ts 0 stays the trace's. Throws
// nlohmann::json::exception on a node's json that does not parse.
std::string merge_traces(const std::vector<NodeTrace>& nodes);

}  // namespace ddp::launcher
