#include "diagnosis/process_activity.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "diagnosis/collective_diagnosis.hpp"

namespace ddp::launcher {

std::optional<ProcessActivity> read_activity(pid_t pid) {
  const std::string dir = "/proc/" + std::to_string(pid) + "/";
  std::ifstream stat(dir + "stat");
  std::string text;
  if (!std::getline(stat, text)) return std::nullopt;
  // Fields after the command (which may hold spaces and parentheses): state is field 3,
  // utime and stime are fields 14 and 15.
  const std::size_t close = text.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream fields(text.substr(close + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i) {
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  ProcessActivity activity;
  activity.cpu_s = static_cast<double>(utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
  std::ifstream io(dir + "io");
  std::string key;
  std::uint64_t value = 0;
  while (io >> key >> value) {
    if (key == "rchar:" || key == "wchar:") activity.io_bytes += value;
  }
  return activity;
}

std::string activity_text(const ProcessActivity& before, const ProcessActivity& after,
                          double window_s) {
  const double cpu = std::max(after.cpu_s - before.cpu_s, 0.0);
  const std::uint64_t io = after.io_bytes > before.io_bytes ? after.io_bytes - before.io_bytes : 0;
  char cpu_text[32];
  std::snprintf(cpu_text, sizeof cpu_text, "%.1f", cpu);
  std::string text = "used " + std::string(cpu_text) + " s of CPU and " +
                     (io == 0 ? std::string("did no I/O") : "did " + byte_text(io) + " of I/O") +
                     " in " + duration_text(window_s);
  // Busy: a tenth of one core or more, or I/O at 64 KiB/s or more.
  const bool busy = cpu >= 0.1 * window_s || static_cast<double>(io) >= 65536.0 * window_s;
  return text + (busy ? ": busy, not blocked" : ": blocked, not busy");
}

}  // namespace ddp::launcher
