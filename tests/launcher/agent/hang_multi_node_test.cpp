// Hang diagnosis across two agents (c10d on loopback): the rank to blame (blocked before the
// 3rd all-reduce) lives on the other node, and both agents' reports name it.
#include <catch2/catch.hpp>
#include <chrono>
#include <sstream>

#include "multi_node_harness.hpp"

using namespace ddp::test;

namespace {

std::vector<std::string> hang_node(int port, const std::string& run_id,
                                   const std::filesystem::path& logs) {
  std::vector<std::string> argv = {bin_path("ddprun").string()};
  for (std::string option : c10d_node("2", port, run_id)) {
    if (option == "--nproc_per_node=1") option = "--nproc_per_node=2";
    argv.push_back(option);
  }
  argv.insert(argv.end(), {"--hang_timeout=2", "--shutdown_timeout=5", "--log_dir=" + logs.string(),
                           bin_path("ddp-hang-worker").string(), "--steps", "5", "--rank", "2",
                           "--sleep-before", "3"});
  return argv;
}

// The verdict: its own ("ddprun: the job hung at ...") on the agent that saw the hang first,
// the reason it stops ("ddprun: stopping the workers: the job hung at ...") on the other.
std::string verdict_line(const std::string& err) {
  std::istringstream lines(err);
  std::string line;
  while (std::getline(lines, line)) {
    const auto at = line.find("the job hung at ");
    if (line.rfind("ddprun: ", 0) == 0 && at != std::string::npos) return line.substr(at);
  }
  return "";
}

}  // namespace

TEST_CASE("hang across two agents: both name the rank on the other node that never entered") {
  TempDir logs_a, logs_b;
  const int port = free_port();
  ChildProcess a(hang_node(port, "hang2", logs_a.path()));
  ChildProcess b(hang_node(port, "hang2", logs_b.path()));
  const ProcessResult ra = a.wait(milliseconds(90000));
  const ProcessResult rb = b.wait(milliseconds(90000));
  INFO("node a:\n" << ra.err << "\nnode b:\n" << rb.err);
  CHECK(ra.status != 0);
  CHECK(rb.status != 0);
  for (const std::string& err : {ra.err, rb.err}) {
    const std::string verdict = verdict_line(err);
    CHECK_THAT(verdict, Catch::StartsWith("the job hung at collective 3 (all_reduce"));
    CHECK_THAT(verdict, Catch::Contains("ranks 0, 1, 3 have waited in it"));
    CHECK_THAT(verdict, Catch::Contains("rank 2 ("));
    CHECK_THAT(verdict, Catch::Contains("never entered it"));
  }
}
