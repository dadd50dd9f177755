#pragma once
// The job's timeline as Chrome Trace Event JSON (opened by Perfetto or chrome://tracing): the
// agent's events on one track, each rank's collectives and Reducer steps on tracks of its own.
// Collects spans from the ranks' record pages as they go by (the rings hold the last 256
// collectives and 64 steps: read them often enough) and writes the whole file at the end.
// Not thread-safe: one owner (the agent's loop). Internal to the launcher.

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ddp/common/collective_record.hpp"

namespace ddp::launcher {

// The most events one node keeps (about 40 MB of JSON): past it, collective and step spans
// are counted instead (cut()), the agent's own events still kept.
inline constexpr std::size_t kMaxTraceEvents = 200000;

class TraceEvents {
 public:
  // Times are CLOCK_MONOTONIC ns; the trace starts at `origin_ns` (ts 0). `node` names the
  // process track of this node's events.
  TraceEvents(std::uint64_t origin_ns, std::string node, std::size_t max_events = kMaxTraceEvents);

  // The agent's own: a span ("rendezvous round 3") or an instant ("worker 1 failed").
  void agent_span(const std::string& name, std::uint64_t begin_ns, std::uint64_t end_ns,
                  const std::string& detail = "");
  void agent_instant(const std::string& name, std::uint64_t at_ns, const std::string& detail = "");

  // Reads the finished collectives and steps of one rank's page that are new since the last
  // call for (attempt, rank): one span per collective (queued -> finished, started marked;
  // those of the process's other communicators, its lanes 1.., name theirs in "communicator")
  // and per step (backward: begin -> ready; its wait: ready -> finalized).
  void collect(int attempt, int rank, const record::RecordPage& page);

  // Spans lost because the ring moved on between two collects (a trace read too seldom).
  std::uint64_t missed() const { return missed_; }
  // Spans not kept because the trace held max_events already.
  std::uint64_t cut() const { return cut_; }
  std::size_t size() const { return events_.size(); }
  std::uint64_t origin_ns() const { return origin_ns_; }

  // {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}
  std::string json() const;

 private:
  struct Event {
    std::string name;
    std::string category;
    char phase = 'X';  // X: complete span, i: instant, M: metadata
    std::uint64_t ts_ns = 0;
    std::uint64_t dur_ns = 0;
    int pid = 0;
    int tid = 0;
    std::string args;  // a JSON object's text, or empty
  };
  void add(Event event);
  std::uint64_t rel(std::uint64_t ns) const { return ns > origin_ns_ ? ns - origin_ns_ : 0; }
  int rank_track(int attempt, int rank);
  // The spans of lane `lane`'s collectives after `seen` (updated).
  void collect_lane(int attempt, int tid, const record::RecordPage& page, std::uint32_t lane,
                    std::uint64_t& seen);

  std::uint64_t origin_ns_;
  std::string node_;
  std::vector<Event> events_;
  struct Seen {
    std::uint64_t collectives[record::kCommunicatorLanes] = {};  // read so far, per lane
    std::uint64_t steps = 0;                                     // steps read so far
  };
  std::map<std::pair<int, int>, Seen> seen_;  // by (attempt, rank)
  std::map<int, bool> named_;                 // rank tracks with their name written
  std::uint64_t missed_ = 0;
  std::size_t max_events_;
  std::uint64_t cut_ = 0;
};

}  // namespace ddp::launcher
