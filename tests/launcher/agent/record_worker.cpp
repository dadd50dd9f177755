// A worker that records all-reduces in ddprun's collective record page without a
// communicator, so that a hang can be made at a size no real collective fits on one machine
// (hundreds of agents): the agents, their exchange and the gatherer are the real ones.
//   ddp-record-worker [--every-ms MS] [--stuck-rank R] [--stuck-at K]
// Every rank records all-reduces 1, 2, ... one every MS milliseconds (default 100), each queued,
// started and finished at once, as ranks in step would. From collective K on (default 0:
// never) rank R stops before it (as a rank stuck in its data loader would), and every other
// rank queues and starts K and never finishes it (waiting for R). Then each waits until a
// signal ends it. Prints "recording rank=<r>" once its recorder is attached.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "collective_recorder.hpp"

int main(int argc, char** argv) {
  long every_ms = 100;
  long stuck_rank = -1;
  long stuck_at = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const long value = std::strtol(argv[i + 1], nullptr, 10);
    if (flag == "--every-ms") {
      every_ms = value;
    } else if (flag == "--stuck-rank") {
      stuck_rank = value;
    } else if (flag == "--stuck-at") {
      stuck_at = value;
    } else {
      std::fprintf(stderr, "ddp-record-worker: unknown option %s\n", flag.c_str());
      return 2;
    }
  }
  const char* rank_text = std::getenv("RANK");
  const char* world_text = std::getenv("WORLD_SIZE");
  if (!rank_text || !world_text) {
    std::fprintf(stderr,
                 "ddp-record-worker: RANK and WORLD_SIZE must be set (run it under ddprun)\n");
    return 2;
  }
  const int rank = std::atoi(rank_text);
  auto recorder = ddp::detail::CollectiveRecorder::attach(
      std::nullopt, rank, std::atoi(world_text), ddp::Backend::Gloo, std::chrono::minutes(10));
  if (!recorder) {
    std::fprintf(stderr, "ddp-record-worker: no record page (DDPRUN_RECORD_FD)\n");
    return 2;
  }
  std::printf("recording rank=%d\n", rank);
  std::fflush(stdout);
  for (long k = 1;; ++k) {
    std::this_thread::sleep_for(std::chrono::milliseconds(every_ms));
    if (k == stuck_at && rank == stuck_rank) break;
    const std::uint64_t seq =
        recorder->on_queued(ddp::record::Op::kAllReduce, ddp::record::pack_name("float32"), 1024,
                            4096, ddp::record::kNoBucket);
    recorder->on_started(seq);
    if (k == stuck_at) break;
    recorder->on_finished(seq, false);
  }
  for (;;) ::pause();
}
