#pragma once
// Where each Python worker was: the stacks that faulthandler writes, either into the stack file
// of ddprun's Python probe (PythonStackCapture) or, for a fatal error, on the worker's stderr.
// These functions find the dump in such text and group ranks by identical stacks. Pure text
// work, no processes. Internal to the launcher.

#include <string>
#include <string_view>
#include <vector>

namespace ddp::launcher {

struct PythonStack {
  int rank = -1;
  int local_rank = -1;
  std::string dump;   // the faulthandler dump: its thread blocks
  std::string error;  // why there is none
};

// The thread blocks of a dump that faulthandler.register() wrote: the thread headers
// ("Thread 0x... (most recent call first):") and their frames ("  File ..., line N in f"),
// other lines dropped; "" when there are none.
std::string faulthandler_threads(std::string_view text);

// The innermost frame of the dump's last thread (the main thread: faulthandler lists it
// last), as "f (file.py:12)"; "" when the dump has no frame.
std::string innermost_frame(std::string_view dump);

// Why a rank has no stack when it had exited, or was exiting with no Python code left to run.
inline constexpr const char* kExitedNoFrame = "it had exited (no Python frame was left)";

// Groups ranks by identical dumps (thread ids aside), largest group first:
//   "1 rank (rank 1): in main (train.py:42)" then the dump's threads, indented;
// a rank without a dump is listed with why; so is one whose dump has no Python frame at all
// (faulthandler's "<no Python frame>" in every thread: it was exiting), as kExitedNoFrame.
std::string group_python_stacks(const std::vector<PythonStack>& stacks);

}  // namespace ddp::launcher
