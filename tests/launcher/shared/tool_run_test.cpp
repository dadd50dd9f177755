// run_tool: a diagnosis tool as a child process, bounded by its deadline whatever it does.
#include "shared/tool_run.hpp"

#include <pthread.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <csignal>
#include <thread>

using namespace ddp::launcher;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

void on_signal(int) {}

}  // namespace

TEST_CASE("a tool's output and exit code come back") {
  const ToolRun run = run_tool({"sh", "-c", "echo out; echo err >&2; exit 3"}, 10s);
  CHECK(run.spawn_error == 0);
  CHECK_FALSE(run.timed_out);
  CHECK(run.exited);
  CHECK(run.exit_code == 3);
  CHECK(run.output == "out\nerr\n");
  CHECK(run_tool({"no-such-tool-ddprun"}, 1s).spawn_error == ENOENT);
}

TEST_CASE("a signal to the waiting thread is not the deadline") {
  // SIGUSR2 with a handler and no SA_RESTART: poll() and read() return EINTR.
  struct sigaction action {
  }, old{};
  action.sa_handler = on_signal;
  REQUIRE(::sigaction(SIGUSR2, &action, &old) == 0);
  const pthread_t waiter = ::pthread_self();
  std::atomic<bool> done{false};
  std::thread signaller([&] {
    while (!done) {
      ::pthread_kill(waiter, SIGUSR2);
      std::this_thread::sleep_for(20ms);
    }
  });
  const ToolRun run = run_tool({"sh", "-c", "sleep 0.5; echo finished"}, 20s);
  done = true;
  signaller.join();
  ::sigaction(SIGUSR2, &old, nullptr);
  CHECK_FALSE(run.timed_out);
  CHECK(run.exited);
  CHECK(run.output == "finished\n");
}

TEST_CASE("a tool that closes its output but does not exit is killed at the deadline") {
  const auto start = Clock::now();
  const ToolRun run = run_tool({"sh", "-c", "exec >&- 2>&-; sleep 60"}, 500ms);
  CHECK(run.timed_out);
  CHECK_FALSE(run.exited);
  CHECK(Clock::now() - start < 30s);  // not the 60 s of its sleep
}
