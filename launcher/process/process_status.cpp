#include "process_status.hpp"

#include <sys/stat.h>

#include <cstdint>
#include <fstream>
#include <string>

namespace ddp::launcher {

bool catches_signal(pid_t pid, int signal) {
  if (signal <= 0 || signal > 64) return false;
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  const std::string key = "SigCgt:";
  for (std::string line; std::getline(status, line);) {
    if (!line.starts_with(key)) continue;
    try {
      const std::uint64_t caught = std::stoull(line.substr(key.size()), nullptr, 16);
      return ((caught >> (signal - 1)) & 1) != 0;
    } catch (const std::exception&) {
      return false;
    }
  }
  return false;
}

bool holds_same_file(pid_t pid, int fd, int ours) {
  if (fd < 0) return false;
  struct stat theirs {
  }, mine{};
  const std::string link = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  if (::stat(link.c_str(), &theirs) != 0 || ::fstat(ours, &mine) != 0) return false;
  return theirs.st_dev == mine.st_dev && theirs.st_ino == mine.st_ino;
}

}  // namespace ddp::launcher
