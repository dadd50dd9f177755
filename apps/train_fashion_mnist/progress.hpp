#pragma once
// Rank 0's progress output: a line updated in place while an epoch runs when the output is a
// terminal, plain lines at each quarter of the epoch otherwise (a log, ddprun's pipe), and a
// summary line per epoch.

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <string>

namespace fmnist {

class Progress {
 public:
  // Writes to out when enabled (rank 0); in place when out is a terminal.
  Progress(bool enabled, std::FILE* out);

  // Starts an epoch of `total` samples (all ranks together).
  void start_epoch(int epoch, int epochs, std::size_t total);
  // `done` samples of the epoch so far (all ranks), mean loss so far.
  void update(std::size_t done, double loss);
  // Ends the in-place line and prints the summary.
  void end_epoch(const std::string& summary);
  // A line of its own (after ending any in-place line).
  void note(const std::string& line);

 private:
  using Clock = std::chrono::steady_clock;
  void write_line(std::size_t done, double loss, bool in_place);

  bool enabled_;
  bool tty_;
  std::FILE* out_;
  int epoch_ = 0;
  int epochs_ = 0;
  std::size_t total_ = 0;
  int next_quarter_ = 1;
  bool line_open_ = false;
  Clock::time_point start_;
  Clock::time_point last_draw_;
};

}  // namespace fmnist
