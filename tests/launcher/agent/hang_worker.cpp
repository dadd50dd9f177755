// A libddp worker that hangs on purpose, for the hang diagnosis tests (hang_test.cpp):
//   ddp-hang-worker [--steps N] [--count C] [--rank R] [--skip K] [--sleep-before K]
//                   [--sleep-ms MS] [--half-count K] [--step-ms MS] [--slow-ms MS]
//                   [--reducer 1] [--second 1]
// Every rank runs N all-reduces of C floats (a step each). Rank R (default 0), and only it:
// --skip K stops before the K-th and exits 0 (a rank with less work); --sleep-before K
// sleeps for an hour (or --sleep-ms) before the K-th (a stuck data loader, or a long
// checkpoint); --half-count K calls the K-th with
// C/2 elements (a desync); --slow-ms sleeps that long before each of its steps (a straggler).
// --step-ms sleeps that long before every step on every rank. --reducer 1: each step is a
// ddp::Reducer step over two parameters of C/2 floats (step records) instead of an all-reduce.
// --second 1: the steps run on a second Context (a second init(), as a program with a Gloo
// and an NCCL communicator has), after one barrier on the first.
// Prints "ready rank=<r> pid=<pid>" once its communicator is made, "done rank=<r>" at the end.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ddp/runtime.hpp"

namespace {

struct Options {
  int steps = 5;
  std::size_t count = 1024;
  int rank = 0;
  int skip = 0;
  int sleep_before = 0;
  int sleep_ms = 3600 * 1000;
  int half_count = 0;
  int step_ms = 0;
  int slow_ms = 0;
  bool reducer = false;
  bool second = false;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const long value = std::strtol(argv[i + 1], nullptr, 10);
    if (flag == "--steps")
      o.steps = static_cast<int>(value);
    else if (flag == "--count")
      o.count = static_cast<std::size_t>(value);
    else if (flag == "--rank")
      o.rank = static_cast<int>(value);
    else if (flag == "--skip")
      o.skip = static_cast<int>(value);
    else if (flag == "--sleep-before")
      o.sleep_before = static_cast<int>(value);
    else if (flag == "--sleep-ms")
      o.sleep_ms = static_cast<int>(value);
    else if (flag == "--half-count")
      o.half_count = static_cast<int>(value);
    else if (flag == "--step-ms")
      o.step_ms = static_cast<int>(value);
    else if (flag == "--slow-ms")
      o.slow_ms = static_cast<int>(value);
    else if (flag == "--reducer")
      o.reducer = value != 0;
    else if (flag == "--second")
      o.second = value != 0;
    else {
      std::fprintf(stderr, "ddp-hang-worker: unknown option %s\n", flag.c_str());
      std::exit(2);
    }
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  try {
    ddp::Context first = ddp::init();
    std::optional<ddp::Context> second;
    if (o.second) {
      first.barrier();
      second.emplace(ddp::init());
    }
    ddp::Context& ctx = second ? *second : first;
    const bool me = ctx.rank() == o.rank;
    std::printf("ready rank=%d pid=%d\n", ctx.rank(), static_cast<int>(::getpid()));
    std::fflush(stdout);
    std::vector<float> data(o.count, 1.0f);
    std::vector<float> a(o.count / 2, 1.0f), b(o.count - o.count / 2, 1.0f);
    std::optional<ddp::Reducer> reducer;
    if (o.reducer) {
      reducer.emplace(
          ctx, std::vector<ddp::Parameter>{{"a", std::span<float>(a)}, {"b", std::span<float>(b)}});
    }
    for (int step = 1; step <= o.steps; ++step) {
      if (o.step_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(o.step_ms));
      if (me && o.slow_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(o.slow_ms));
      if (reducer) {
        for (std::size_t i = 0; i < reducer->size(); ++i) reducer->mark_ready(i);
        reducer->finalize();
        continue;
      }
      if (me && step == o.skip) break;
      if (me && step == o.sleep_before) {
        std::this_thread::sleep_for(std::chrono::milliseconds(o.sleep_ms));
      }
      const std::size_t n = me && step == o.half_count ? o.count / 2 : o.count;
      ctx.allreduce(std::span<float>(data.data(), n));
    }
    std::printf("done rank=%d\n", ctx.rank());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp-hang-worker: %s\n", e.what());
    return 1;
  }
}
