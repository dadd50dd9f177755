#pragma once
// What a job's tees could not write to their log files (a full disk): each file's first
// failed write is announced once, and at exit the files that miss data are listed, so that
// no log is cut short silently. Used on the agent's io thread only.

#include <cstddef>
#include <functional>
#include <map>
#include <string>

namespace ddp::launcher {

class LogFileErrors {
 public:
  // Receives one notice line (without newline): the first failure of each file.
  using Notice = std::function<void(std::string line)>;

  explicit LogFileErrors(Notice notice);

  // `bytes` of the log file at `path` were not written; `error` is the errno.
  void write_failed(const std::string& path, int error, std::size_t bytes);

  // Empty when every log is complete; else one line naming each incomplete file and how
  // many bytes it misses. Said once: the list is cleared.
  std::string take_incomplete_files_notice();

 private:
  Notice notice_;
  std::map<std::string, std::size_t> lost_;  // bytes not written, by file
};

}  // namespace ddp::launcher
