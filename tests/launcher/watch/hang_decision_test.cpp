// decide_hang: when a hang verdict stops the job and when it only warns.
#include <catch2/catch.hpp>

#include "watch/hang_monitor.hpp"

using namespace ddp::launcher;
using namespace std::chrono_literals;

namespace {

// Two ranks of one node that have waited `waited_s` in collective 5, recorded by `writer`.
std::vector<RankView> waiting(double waited_s, bool nccl_profiler) {
  std::vector<RankView> views;
  for (int r = 0; r < 2; ++r) {
    RankView v;
    v.rank = r;
    v.attached = true;
    v.running = true;
    v.backend = "nccl";
    v.nccl_profiler = nccl_profiler;
    v.queued = 5;
    v.finished = 4;
    v.pending = CollectiveInfo{5, "all_reduce", "float32", 1024, 4096, {}, waited_s, true};
    views.push_back(v);
  }
  return views;
}

}  // namespace

TEST_CASE("a hang past the default timeout is stopped when libddp or the probe recorded it") {
  CollectiveDiagnosis d;
  d.collective = 5;
  const HangAction action = decide_hang(d, waiting(700, false), std::nullopt);
  CHECK(action.stop);
}

TEST_CASE("records of the NCCL profiler plugin alone only warn, unless a stop timeout is given") {
  CollectiveDiagnosis d;
  d.collective = 5;
  const HangAction warn = decide_hang(d, waiting(700, true), std::nullopt);
  CHECK_FALSE(warn.stop);
  CHECK_THAT(warn.text, Catch::Contains("profiler plugin"));
  d.desync = true;  // a send against a recv could read as one
  CHECK_FALSE(decide_hang(d, waiting(700, true), std::nullopt).stop);
  d.desync = false;
  CHECK(decide_hang(d, waiting(700, true), 600s).stop);  // --hang_stop_timeout=600
}
