#include "diagnosis/trace_events.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>

namespace ddp::launcher {
namespace {

constexpr auto kRelaxed = std::memory_order_relaxed;
constexpr int kAgentPid = 0;  // the agent's track; rank r's is pid 1, tid r

}  // namespace

TraceEvents::TraceEvents(std::uint64_t origin_ns, std::string node, std::size_t max_events)
    : origin_ns_(origin_ns), node_(std::move(node)), max_events_(max_events) {
  add({"process_name", "", 'M', 0, 0, kAgentPid, 0,
       nlohmann::json{{"name", "ddprun agent on " + node_}}.dump()});
  add({"process_name", "", 'M', 0, 0, 1, 0, nlohmann::json{{"name", "ranks"}}.dump()});
}

void TraceEvents::add(Event event) {
  // The agent's own events (few) and the tracks' names are always kept.
  if (events_.size() >= max_events_ && event.pid == 1 && event.phase != 'M') {
    ++cut_;
    return;
  }
  events_.push_back(std::move(event));
}

void TraceEvents::agent_span(const std::string& name, std::uint64_t begin_ns, std::uint64_t end_ns,
                             const std::string& detail) {
  add({name, "agent", 'X', rel(begin_ns), end_ns > begin_ns ? end_ns - begin_ns : 0, kAgentPid, 0,
       detail.empty() ? "" : nlohmann::json{{"detail", detail}}.dump()});
}

void TraceEvents::agent_instant(const std::string& name, std::uint64_t at_ns,
                                const std::string& detail) {
  add({name, "agent", 'i', rel(at_ns), 0, kAgentPid, 0,
       detail.empty() ? "" : nlohmann::json{{"detail", detail}}.dump()});
}

int TraceEvents::rank_track(int /*attempt*/, int rank) {
  if (!named_[rank]) {
    named_[rank] = true;
    add({"thread_name", "", 'M', 0, 0, 1, rank,
         nlohmann::json{{"name", "rank " + std::to_string(rank)}}.dump()});
  }
  return rank;
}

void TraceEvents::collect(int attempt, int rank, const record::RecordPage& page) {
  if (page.magic.load(std::memory_order_acquire) != record::kRecordMagic) return;
  Seen& seen = seen_[{attempt, rank}];
  const int tid = rank_track(attempt, rank);

  for (std::uint32_t lane = 0; lane < record::kCommunicatorLanes; ++lane) {
    const std::uint64_t state = record::lane_of(page, lane).state->load(std::memory_order_acquire);
    if (lane == 0 || state == static_cast<std::uint64_t>(record::LaneState::kOpen) ||
        state == static_cast<std::uint64_t>(record::LaneState::kClosed)) {
      collect_lane(attempt, tid, page, lane, seen.collectives[lane]);
    }
  }

  const std::uint64_t steps = page.steps.load(kRelaxed);
  const std::uint64_t first =
      std::max(seen.steps + 1,
               steps > record::kStepSlots ? steps - record::kStepSlots + 1 : std::uint64_t{1});
  std::uint64_t last_read = seen.steps;
  for (std::uint64_t step = first; step <= steps; ++step) {
    const record::StepSlot& slot = page.step_slots[step % record::kStepSlots];
    std::uint64_t got = 0, begin = 0, ready = 0, finalized = 0;
    const bool stable = record::read_stable(slot, [&](const record::StepSlot& s) {
      got = s.step.load(kRelaxed);
      begin = s.begin_ns.load(kRelaxed);
      ready = s.ready_ns.load(kRelaxed);
      finalized = s.finalized_ns.load(kRelaxed);
    });
    if (!stable || got != step || finalized == 0) break;  // in progress: read it next time
    nlohmann::json args = {{"step", step}, {"attempt", attempt}};
    add({"forward+backward", "reducer", 'X', rel(begin), ready > begin ? ready - begin : 0, 1, tid,
         args.dump()});
    add({"wait for all-reduce", "reducer", 'X', rel(ready),
         finalized > ready ? finalized - ready : 0, 1, tid, args.dump()});
    last_read = step;
  }
  seen.steps = last_read;
}

void TraceEvents::collect_lane(int attempt, int tid, const record::RecordPage& page,
                               std::uint32_t lane, std::uint64_t& seen) {
  const record::ConstLane words = record::lane_of(page, lane);
  const std::uint64_t finished = words.finished->load(kRelaxed);
  const std::uint64_t context = lane == 0 ? 0 : words.context->load(kRelaxed);
  if (finished > seen + record::kCollectiveSlots) {
    missed_ += finished - seen - record::kCollectiveSlots;
    seen = finished - record::kCollectiveSlots;
  }
  for (std::uint64_t seq = seen + 1; seq <= finished; ++seq) {
    const record::CollectiveSlot& slot = words.collectives[seq % record::kCollectiveSlots];
    std::uint64_t queued = 0, started = 0, done = 0, bucket = record::kNoBucket, bytes = 0;
    std::uint64_t got_seq = 0, op = 0, failed = 0;
    const bool stable = record::read_stable(slot, [&](const record::CollectiveSlot& s) {
      got_seq = s.seq.load(kRelaxed);
      op = s.op.load(kRelaxed);
      queued = s.queued_ns.load(kRelaxed);
      started = s.started_ns.load(kRelaxed);
      done = s.finished_ns.load(kRelaxed);
      bucket = s.bucket.load(kRelaxed);
      bytes = s.bytes.load(kRelaxed);
      failed = s.failed.load(kRelaxed);
    });
    if (!stable || got_seq != seq || done == 0) {
      ++missed_;
      continue;
    }
    std::string name = record::op_name(op);
    if (bucket != record::kNoBucket) name += " bucket " + std::to_string(bucket);
    nlohmann::json args = {{"seq", seq}, {"bytes", bytes}, {"attempt", attempt}};
    if (started != 0) args["waited_to_start_us"] = (started > queued ? started - queued : 0) / 1000;
    if (failed) args["failed"] = true;
    if (context != 0) args["communicator"] = context;
    add({name, "collective", 'X', rel(queued), done > queued ? done - queued : 0, 1, tid,
         args.dump()});
  }
  seen = std::max(seen, finished);
}

std::string TraceEvents::json() const {
  nlohmann::json events = nlohmann::json::array();
  for (const Event& e : events_) {
    nlohmann::json j = {{"name", e.name},
                        {"ph", std::string(1, e.phase)},
                        {"pid", e.pid},
                        {"tid", e.tid},
                        {"ts", static_cast<double>(e.ts_ns) / 1000.0}};
    if (!e.category.empty()) j["cat"] = e.category;
    if (e.phase == 'X') j["dur"] = static_cast<double>(e.dur_ns) / 1000.0;
    if (e.phase == 'i') j["s"] = "p";
    if (!e.args.empty()) j["args"] = nlohmann::json::parse(e.args);
    events.push_back(std::move(j));
  }
  return nlohmann::json{
      {"traceEvents", std::move(events)},
      {"displayTimeUnit", "ms"},
      {"otherData", {{"node", node_}, {"missed_spans", missed_}, {"cut_spans", cut_}}}}
      .dump();
}

}  // namespace ddp::launcher
