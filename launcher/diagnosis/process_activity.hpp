#pragma once
// What a process did over a while: the CPU time it used and the bytes it read and wrote (any
// file, pipe or socket), from /proc. The hang report's evidence for a rank the others wait
// for: "used 0.0 s of CPU and did no I/O in 300 s: blocked, not busy". Internal to the
// launcher.

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>

namespace ddp::launcher {

struct ProcessActivity {
  double cpu_s = 0;            // user + system time of every thread
  std::uint64_t io_bytes = 0;  // rchar + wchar
};

// The process's counters now; nullopt when /proc does not say (it exited, or no permission).
std::optional<ProcessActivity> read_activity(pid_t pid);

// "used 0.0 s of CPU and did no I/O in 300 s: blocked, not busy", from two readings
// window_s apart.
std::string activity_text(const ProcessActivity& before, const ProcessActivity& after,
                          double window_s);

}  // namespace ddp::launcher
