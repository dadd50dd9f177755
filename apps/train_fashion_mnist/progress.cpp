#include "progress.hpp"

#include <unistd.h>

namespace fmnist {

namespace {
constexpr auto kRedrawInterval = std::chrono::milliseconds(200);  // terminal refresh
}

Progress::Progress(bool enabled, std::FILE* out)
    : enabled_(enabled), tty_(enabled && ::isatty(::fileno(out)) == 1), out_(out) {}

void Progress::start_epoch(int epoch, int epochs, std::size_t total) {
  epoch_ = epoch;
  epochs_ = epochs;
  total_ = total;
  next_quarter_ = 1;
  start_ = last_draw_ = Clock::now();
}

void Progress::update(std::size_t done, double loss) {
  if (!enabled_) return;
  if (tty_) {
    const auto now = Clock::now();
    if (now - last_draw_ < kRedrawInterval) return;
    last_draw_ = now;
    write_line(done, loss, true);
  } else if (next_quarter_ < 4 && done * 4 >= total_ * static_cast<std::size_t>(next_quarter_)) {
    while (next_quarter_ < 4 && done * 4 >= total_ * static_cast<std::size_t>(next_quarter_)) {
      ++next_quarter_;
    }
    write_line(done, loss, false);
  }
}

void Progress::write_line(std::size_t done, double loss, bool in_place) {
  const double seconds = std::chrono::duration<double>(Clock::now() - start_).count();
  const double rate = seconds > 0 ? static_cast<double>(done) / seconds : 0.0;
  std::fprintf(out_, "%sepoch %d/%d  %6zu/%zu samples  loss %.4f  %.0f samples/s%s",
               in_place ? "\r" : "", epoch_ + 1, epochs_, done, total_, loss, rate,
               in_place ? "\x1b[K" : "\n");
  std::fflush(out_);
  line_open_ = in_place;
}

void Progress::end_epoch(const std::string& summary) { note(summary); }

void Progress::note(const std::string& line) {
  if (!enabled_) return;
  if (line_open_) std::fputs("\r\x1b[K", out_);
  line_open_ = false;
  std::fprintf(out_, "%s\n", line.c_str());
  std::fflush(out_);
}

}  // namespace fmnist
