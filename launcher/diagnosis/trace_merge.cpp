#include "diagnosis/trace_merge.hpp"

#include <nlohmann/json.hpp>

namespace ddp::launcher {
namespace {

constexpr int kRanksPid = 1;  // the ranks' tracks (TraceEvents): shared by every node
// Node g's agent track; the writing node keeps TraceEvents' pid 0.
int agent_pid(std::size_t index) { return index == 0 ? 0 : 1 + static_cast<int>(index); }

}  // namespace

std::string merge_traces(const std::vector<NodeTrace>& nodes) {
  nlohmann::json events = nlohmann::json::array();
  nlohmann::json clocks = nlohmann::json::array();
  std::uint64_t missed = 0;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    const NodeTrace& node = nodes[i];
    const nlohmann::json trace = nlohmann::json::parse(node.json);
    // Its ts 0 is origin_ref_ns on the reference clock; the trace's is nodes[0]'s.
    const double shift_us =
        static_cast<double>(node.origin_ref_ns - nodes.front().origin_ref_ns) / 1000.0;
    for (nlohmann::json event : trace.at("traceEvents")) {
      const bool metadata = event.value("ph", "") == "M";
      if (event.value("pid", 0) == kRanksPid) {
        if (i > 0 && metadata && event.value("name", "") == "process_name") continue;
      } else {
        event["pid"] = agent_pid(i);
      }
      if (!metadata) event["ts"] = event.value("ts", 0.0) + shift_us;
      events.push_back(std::move(event));
    }
    missed += trace.value("otherData", nlohmann::json::object()).value("missed_spans", 0ULL);
    clocks.push_back({{"group_rank", node.group_rank},
                      {"host", node.host},
                      {"clock_offset_ms", static_cast<double>(node.offset_ns) / 1e6},
                      {"uncertainty_ms", static_cast<double>(node.uncertainty_ns) / 1e6}});
  }
  return nlohmann::json{{"traceEvents", std::move(events)},
                        {"displayTimeUnit", "ms"},
                        {"otherData",
                         {{"clock", "CLOCK_MONOTONIC of the workers' store host"},
                          {"nodes", std::move(clocks)},
                          {"missed_spans", missed}}}}
      .dump();
}

}  // namespace ddp::launcher
