// TraceEvents: a rank's collectives become spans, and a node keeps at most max_events of them.
#include "diagnosis/trace_events.hpp"

#include <catch2/catch.hpp>
#include <memory>
#include <nlohmann/json.hpp>

using namespace ddp::launcher;
using namespace ddp::record;

namespace {

// A page whose lane 0 finished collectives first..last (each queued at seq µs, done 1 µs later).
void finish(RecordPage& page, std::uint64_t first, std::uint64_t last) {
  for (std::uint64_t seq = first; seq <= last; ++seq) {
    CollectiveSlot& slot = page.collectives[seq % kCollectiveSlots];
    begin_write(slot);
    slot.seq.store(seq);
    slot.op.store(static_cast<std::uint64_t>(Op::kAllReduce));
    slot.queued_ns.store(seq * 1000);
    slot.finished_ns.store(seq * 1000 + 1000);
    end_write(slot);
  }
  page.queued.store(last);
  page.finished.store(last);
}

std::size_t spans_in(const std::string& json) {
  const nlohmann::json trace = nlohmann::json::parse(json);
  std::size_t n = 0;
  for (const auto& e : trace.at("traceEvents")) n += e.at("ph") == "X" ? 1 : 0;
  return n;
}

}  // namespace

TEST_CASE("a node's trace keeps at most max_events, counts what it cut and says so") {
  auto page = std::make_unique<RecordPage>();
  page->version.store(kRecordVersion);
  page->backend.store(pack_name("gloo"));
  page->magic.store(kRecordMagic);
  TraceEvents trace(0, "node-a", 50);
  for (std::uint64_t done = 100; done <= 1000; done += 100) {  // read every 100 collectives
    finish(*page, done - 99, done);
    trace.collect(0, 0, *page);
  }
  trace.agent_instant("done", 2'000'000);  // the agent's own events are always kept
  CHECK(trace.missed() == 0);
  CHECK(trace.size() <= 51);
  CHECK(trace.cut() == 1000 - (trace.size() - 4));  // 1000 spans, minus those kept
  const auto data = nlohmann::json::parse(trace.json());
  CHECK(data["otherData"]["cut_spans"] == trace.cut());
  CHECK(spans_in(trace.json()) + trace.cut() == 1000);
}

TEST_CASE("a trace under its cap keeps every span") {
  auto page = std::make_unique<RecordPage>();
  page->version.store(kRecordVersion);
  page->backend.store(pack_name("gloo"));
  page->magic.store(kRecordMagic);
  TraceEvents trace(0, "node-a");
  finish(*page, 1, 200);
  trace.collect(0, 0, *page);
  CHECK(trace.cut() == 0);
  CHECK(spans_in(trace.json()) == 200);
}
