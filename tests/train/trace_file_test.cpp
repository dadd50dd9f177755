// --trace_file over a real job: the 2-rank trainer, made to crash once and restart. The file
// must be Trace Event JSON with the agent's rendezvous and restart events, collective spans
// for every rank, and bucket all-reduces that start while backward still runs.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "skip.hpp"
#include "test_support.hpp"

using nlohmann::json;

namespace {

constexpr const char* kDataDir = "/usr/share/datasets/fashion-mnist";

}  // namespace

TEST_CASE("trace file: a 2-rank trainer's timeline, with its restart, as Trace Event JSON") {
  if (!std::filesystem::exists(std::string(kDataDir) + "/t10k-labels-idx1-ubyte.gz")) {
    return ddp::test::skip("dataset-fashion-mnist is not installed (scripts/setup installs it)");
  }
  ddp::test::TempDir dir;
  const auto trace_path = dir.path() / "trace.json";
  const std::string command =
      ddp::test::bin_path("ddprun").string() + " --standalone --nproc_per_node=2 --max_restarts=1" +
      " --trace_file=" + trace_path.string() + " " +
      ddp::test::bin_path("train_fashion_mnist").string() +
      " --train_limit 2000 --test_limit 500 --batch_size 32 --epochs 2 --crash_at_step 40" +
      " --checkpoint_dir " + (dir.path() / "ckpt").string();
  const auto result = ddp::test::run_shell(command, 300);
  INFO(result.output);
  REQUIRE(result.status == 0);
  CHECK_THAT(result.output,
             Catch::Contains("ddprun: the job's timeline is in " + trace_path.string()));

  std::ifstream in(trace_path);
  REQUIRE(in.good());
  const json trace = json::parse(in);
  REQUIRE(trace.contains("traceEvents"));
  const json& events = trace["traceEvents"];
  std::set<std::string> agent_events;
  std::map<int, int> collectives_of_rank;
  std::map<int, std::vector<std::pair<double, double>>> backward, allreduce;  // [ts, end)
  for (const json& e : events) {
    REQUIRE(e.contains("ph"));
    REQUIRE(e.contains("name"));
    const std::string ph = e["ph"];
    if (ph == "M") continue;
    REQUIRE(e["ts"].is_number());
    const std::string cat = e.value("cat", "");
    if (cat == "agent") agent_events.insert(e["name"].get<std::string>());
    if (ph != "X") continue;
    REQUIRE(e["dur"].is_number());
    const int rank = e["tid"];
    const double ts = e["ts"], end = ts + e["dur"].get<double>();
    const std::string name = e["name"];
    if (cat == "collective") ++collectives_of_rank[rank];
    if (name == "forward+backward") backward[rank].push_back({ts, end});
    if (name.rfind("all_reduce bucket ", 0) == 0) allreduce[rank].push_back({ts, end});
  }
  CHECK(agent_events.count("rendezvous") == 1);
  CHECK(agent_events.count("worker failed") == 1);
  CHECK(agent_events.count("restart") == 1);
  CHECK(agent_events.count("done") == 1);
  CHECK(collectives_of_rank[0] > 50);
  CHECK(collectives_of_rank[1] > 50);
  // Overlap: some bucket all-reduce starts before the backward span around it has ended.
  for (int rank : {0, 1}) {
    int overlapping = 0;
    for (const auto& [b0, b1] : backward[rank]) {
      for (const auto& [a0, a1] : allreduce[rank]) {
        if (a0 >= b0 && a0 < b1) ++overlapping;
      }
    }
    INFO("rank " << rank << ": " << backward[rank].size() << " backward spans, "
                 << allreduce[rank].size() << " bucket all-reduces");
    CHECK(overlapping > 0);
  }
}
