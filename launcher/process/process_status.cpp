#include "process/process_status.hpp"

#include <sys/stat.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

namespace ddp::launcher {
namespace {

// Whether `signal`'s bit is set in the mask a /proc status file gives after `key` ("SigBlk:").
// nullopt when the file or the key cannot be read.
std::optional<bool> mask_has(const std::string& path, const std::string& key, int signal) {
  std::ifstream status(path);
  for (std::string line; std::getline(status, line);) {
    if (!line.starts_with(key)) continue;
    try {
      const std::uint64_t mask = std::stoull(line.substr(key.size()), nullptr, 16);
      return ((mask >> (signal - 1)) & 1) != 0;
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }
  return std::nullopt;
}

std::vector<pid_t> threads_of(pid_t pid) {
  std::vector<pid_t> threads;
  std::error_code ec;
  for (const auto& entry :
       std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
    try {
      threads.push_back(static_cast<pid_t>(std::stol(entry.path().filename().string())));
    } catch (const std::exception&) {
    }
  }
  return threads;
}

std::string task_status(pid_t pid, pid_t thread) {
  return "/proc/" + std::to_string(pid) + "/task/" + std::to_string(thread) + "/status";
}

}  // namespace

std::set<pid_t> threads_blocking(pid_t pid, int signal) {
  std::set<pid_t> blocking;
  if (signal <= 0 || signal > 64) return blocking;
  for (const pid_t thread : threads_of(pid)) {
    if (mask_has(task_status(pid, thread), "SigBlk:", signal).value_or(false)) {
      blocking.insert(thread);
    }
  }
  return blocking;
}

bool handled_signal(pid_t pid, int signal, const std::set<pid_t>& blocking_before) {
  if (signal <= 0 || signal > 64) return true;
  const auto shared = mask_has("/proc/" + std::to_string(pid) + "/status", "ShdPnd:", signal);
  if (!shared) return true;  // gone
  if (*shared) return false;
  for (const pid_t thread : threads_of(pid)) {
    const std::string path = task_status(pid, thread);
    if (mask_has(path, "SigPnd:", signal).value_or(false)) return false;
    if (!blocking_before.contains(thread) && mask_has(path, "SigBlk:", signal).value_or(false)) {
      return false;  // in the handler
    }
  }
  return true;
}

bool catches_signal(pid_t pid, int signal) {
  if (signal <= 0 || signal > 64) return false;
  return mask_has("/proc/" + std::to_string(pid) + "/status", "SigCgt:", signal).value_or(false);
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
