// Reading the stack dumps faulthandler writes into the probe's stack file, and grouping ranks
// by stack.
#include "diagnosis/python_stacks.hpp"

#include <catch2/catch.hpp>

using namespace ddp::launcher;

namespace {

// What faulthandler.register(all_threads=True) writes on its signal (Python 3.11).
std::string dump_at(const std::string& file, int line, const std::string& thread_id) {
  return "Thread 0x00007f0000000001 (most recent call first):\n"
         "  File \"/usr/lib/python3.11/threading.py\", line 324 in wait\n\n"
         "Current thread " +
         thread_id +
         " (most recent call first):\n"
         "  File \"/work/" +
         file + "\", line " + std::to_string(line) +
         " in step\n"
         "  File \"/work/train.py\", line 80 in <module>\n\n";
}

}  // namespace

TEST_CASE("a dump leaves out ddprun's own frames: the probe's wait wrapper, the template's") {
  const std::string dump = faulthandler_threads(
      "Current thread 0x01 (most recent call first):\n"
      "  File \"/usr/share/ddprun/python/_ddprun_probe.py\", line 180 in wait\n"
      "  File \"/usr/share/ddprun/python/_ddprun_probe.py\", line 243 in wait_recorded\n"
      "  File \"/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py\", line 1536 "
      "in all_reduce\n"
      "  File \"/work/train.py\", line 12 in <module>\n"
      "  File \"/opt/ddprun/share/ddprun/python/_ddprun_template.py\", line 400 in _serve\n"
      "  File \"/opt/ddprun/share/ddprun/python/_ddprun_template.py\", line 500 in <module>\n"
      "  File \"/work/_ddprun_mine.py\", line 3 in helper\n");
  CHECK_THAT(dump, !Catch::Contains("ddprun/python/_ddprun_"));
  CHECK_THAT(dump, Catch::Contains("in all_reduce"));
  CHECK_THAT(dump, Catch::Contains("/work/_ddprun_mine.py"));  // the program's own file
  CHECK(innermost_frame(dump) == "all_reduce (distributed_c10d.py:1536)");
}

TEST_CASE("a dump keeps its thread headers and frames, and the innermost frame is found") {
  const std::string dump = faulthandler_threads("\n" + dump_at("train.py", 42, "0x02") + "\n");
  CHECK_THAT(dump, Catch::StartsWith("Thread 0x00007f0000000001 (most recent call first):\n"));
  CHECK_THAT(dump, Catch::Contains("\"/work/train.py\", line 42 in step"));
  CHECK(dump.find("\n\n") == std::string::npos);  // the blank lines between threads go
  CHECK(innermost_frame(dump) == "step (train.py:42)");
  CHECK(faulthandler_threads("no dump here\n").empty());
  CHECK(innermost_frame("").empty());
}

TEST_CASE("ranks with the same Python stack are one group, whatever their thread ids") {
  std::vector<PythonStack> stacks;
  for (int rank = 0; rank < 3; ++rank) {
    stacks.push_back({rank, rank,
                      faulthandler_threads(dump_at("train.py", 42, "0x0" + std::to_string(rank))),
                      ""});
  }
  stacks.push_back({3, 3, faulthandler_threads(dump_at("loader.py", 7, "0x09")), ""});
  stacks.push_back({4, 0, "", "its stderr is a terminal"});
  const std::string text = group_python_stacks(stacks);
  INFO(text);
  CHECK_THAT(text, Catch::StartsWith("3 ranks (ranks 0-2): in step (train.py:42)\n"));
  CHECK_THAT(text, Catch::Contains("1 rank (rank 3): in step (loader.py:7)\n"));
  CHECK_THAT(text, Catch::Contains("  Current thread (most recent call first):\n"));
  CHECK_THAT(text, Catch::Contains("rank 4: no stack: its stderr is a terminal\n"));
  CHECK_THAT(text, !Catch::Contains("0x0"));
}

TEST_CASE("a rank whose dump has no Python frame had exited, and reads so") {
  // What faulthandler writes for a process whose Python code has ended (it is exiting).
  const std::string exiting =
      "Current thread 0x00007f0000000003 (most recent call first):\n  <no Python frame>\n";
  std::vector<PythonStack> stacks;
  stacks.push_back({0, 0, faulthandler_threads(dump_at("train.py", 42, "0x01")), ""});
  stacks.push_back({1, 1, faulthandler_threads(exiting), ""});
  const std::string text = group_python_stacks(stacks);
  INFO(text);
  CHECK_THAT(text, Catch::StartsWith("1 rank (rank 0): in step (train.py:42)\n"));
  CHECK_THAT(text, Catch::Contains("rank 1: no stack: it had exited"));
  CHECK_THAT(text, !Catch::Contains("<no Python frame>"));
}
