#pragma once
// Runs a tool (eu-stack, PyTorch's Flight Recorder analyser, an interpreter asked its flags) as
// a child process with its stdout and stderr captured together, bounded by a deadline (then
// SIGKILL) and by the bytes kept. Blocking: call off the agent's loop. Internal to the launcher.

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

namespace ddp::launcher {

struct ToolRun {
  int spawn_error = 0;     // errno of a failed spawn (ENOENT: not found); then nothing ran
  bool timed_out = false;  // killed at the deadline
  bool exited = false;     // exited by itself (not a signal)
  int exit_code = -1;      // when exited
  std::string output;      // stdout and stderr, at most max_output bytes (the first ones)

  bool succeeded() const { return spawn_error == 0 && !timed_out && exited && exit_code == 0; }
};

// argv[0] is looked up on PATH; the environment is the agent's.
ToolRun run_tool(const std::vector<std::string>& argv, std::chrono::milliseconds timeout,
                 std::size_t max_output = 1024 * 1024);

}  // namespace ddp::launcher
