// Reading faulthandler's dumps out of a worker's stderr, and grouping ranks by stack.
#include "diagnosis/python_stacks.hpp"

#include <catch2/catch.hpp>

using namespace ddp::launcher;

namespace {

// What Python 3.11 prints on SIGABRT with PYTHONFAULTHANDLER=1, after other output.
std::string dump_at(const std::string& file, int line, const std::string& thread_id) {
  return "Fatal Python error: Aborted\n\n"
         "Thread 0x00007f0000000001 (most recent call first):\n"
         "  File \"/usr/lib/python3.11/threading.py\", line 324 in wait\n\n"
         "Current thread " +
         thread_id +
         " (most recent call first):\n"
         "  File \"/work/" +
         file + "\", line " + std::to_string(line) +
         " in step\n"
         "  File \"/work/train.py\", line 80 in <module>\n\n"
         "Extension modules: torch._C, numpy.core._multiarray_umath (total: 2)\n";
}

}  // namespace

TEST_CASE("the last faulthandler dump is cut out of a stream, without the lines between") {
  const std::string stream = "epoch 1 loss 0.3\n" + dump_at("old.py", 1, "0x01") +
                             "restarted\nsome log line\n" + dump_at("train.py", 42, "0x02") +
                             "a line after the dump\n";
  const std::string dump = last_faulthandler_dump(stream);
  CHECK_THAT(dump, Catch::StartsWith("Fatal Python error: Aborted\n"));
  CHECK_THAT(dump, Catch::Contains("\"/work/train.py\", line 42 in step"));
  CHECK_THAT(dump, !Catch::Contains("old.py"));
  CHECK_THAT(dump, !Catch::Contains("Extension modules"));
  CHECK_THAT(dump, !Catch::Contains("a line after"));
  CHECK(innermost_frame(dump) == "step (train.py:42)");
  CHECK(last_faulthandler_dump("no dump here\n").empty());
  CHECK(innermost_frame("").empty());
}

TEST_CASE("ranks with the same Python stack are one group, whatever their thread ids") {
  std::vector<PythonStack> stacks;
  for (int rank = 0; rank < 3; ++rank) {
    stacks.push_back({rank, rank,
                      last_faulthandler_dump(dump_at("train.py", 42, "0x0" + std::to_string(rank))),
                      ""});
  }
  stacks.push_back({3, 3, last_faulthandler_dump(dump_at("loader.py", 7, "0x09")), ""});
  stacks.push_back({4, 0, "", "its stderr is a terminal"});
  const std::string text = group_python_stacks(stacks);
  INFO(text);
  CHECK_THAT(text, Catch::StartsWith("3 ranks (ranks 0-2): in step (train.py:42)\n"));
  CHECK_THAT(text, Catch::Contains("1 rank (rank 3): in step (loader.py:7)\n"));
  CHECK_THAT(text, Catch::Contains("  Current thread (most recent call first):\n"));
  CHECK_THAT(text, Catch::Contains("rank 4: no stack: its stderr is a terminal\n"));
  CHECK_THAT(text, !Catch::Contains("0x0"));
}
