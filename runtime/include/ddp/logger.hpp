#pragma once
// A rank-aware logger: "[rank 3] message" lines, from rank 0 only unless asked for all ranks.

#include <cstdio>
#include <sstream>
#include <string>
#include <string_view>

namespace ddp {

class Context;

class Logger {
 public:
  // Writes to `out` (stderr by default), which must outlive the logger.
  explicit Logger(int rank, bool all_ranks = false, std::FILE* out = stderr)
      : rank_(rank), all_ranks_(all_ranks), out_(out) {}
  explicit Logger(const Context& context, bool all_ranks = false, std::FILE* out = stderr);

  // Log from every rank (true) or from rank 0 only (false, the default).
  void set_all_ranks(bool all_ranks) { all_ranks_ = all_ranks; }
  // Whether this rank writes.
  bool enabled() const { return all_ranks_ || rank_ == 0; }

  // Streams the arguments into one line: logger.info("epoch ", e, " loss ", loss).
  // Each line is written with one call, so lines from threads do not interleave.
  template <typename... Args>
  void info(const Args&... args) const {
    if (!enabled()) return;
    std::ostringstream line;
    (line << ... << args);
    write(line.str());
  }
  // The same on every rank, whatever the setting.
  template <typename... Args>
  void all(const Args&... args) const {
    std::ostringstream line;
    (line << ... << args);
    write(line.str());
  }

 private:
  void write(std::string_view message) const;

  int rank_;
  bool all_ranks_;
  std::FILE* out_;
};

}  // namespace ddp
