#include "ddp/launcher/output_tee.hpp"

#include <algorithm>
#include <boost/asio/post.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>

namespace ddp::launcher {

namespace {
constexpr std::size_t kReadChunk = 64 * 1024;
}  // namespace

void OutputTee::start(boost::asio::io_context& io, UniqueFd source, UniqueFd file,
                      ConsoleSink console, std::string prefix, std::function<void()> on_done,
                      TeeLog log, ConsoleGate gate) {
  auto tee = std::make_shared<OutputTee>(io, std::move(source), std::move(file), std::move(console),
                                         std::move(prefix), std::move(on_done), std::move(log),
                                         std::move(gate));
  tee->read_more();
}

OutputTee::OutputTee(boost::asio::io_context& io, UniqueFd source, UniqueFd file,
                     ConsoleSink console, std::string prefix, std::function<void()> on_done,
                     TeeLog log, ConsoleGate gate)
    : source_(io, source.release()),
      file_(std::move(file)),
      log_(std::move(log)),
      gate_(std::move(gate)),
      console_(std::move(console)),
      prefix_(std::move(prefix)),
      on_done_(std::move(on_done)),
      buffer_(kReadChunk) {}

void OutputTee::read_more() {
  source_.async_read_some(boost::asio::buffer(buffer_),
                          [self = shared_from_this()](boost::system::error_code ec, std::size_t n) {
                            if (n > 0) self->consume(self->buffer_.data(), n);
                            if (ec) {
                              self->finish();
                            } else {
                              self->read_on();
                            }
                          });
}

void OutputTee::read_on() {
  if (!console_ || !gate_) return read_more();
  auto resume = [self = shared_from_this()] {
    boost::asio::post(self->source_.get_executor(), [self] { self->read_more(); });
  };
  if (!gate_(std::move(resume))) read_more();
}

// A failed write loses these bytes from the file, not the file: later output is written
// again (a disk that had filled up may have room by then).
void OutputTee::write_file(const char* data, std::size_t size) {
  if (!file_.valid()) return;
  int error = 0;
  const std::size_t written = write_all_counted(file_.get(), data, size, &error);
  if (error != 0 && log_.errors) log_.errors->write_failed(log_.path, error, size - written);
}

void OutputTee::consume(const char* data, std::size_t size) {
  write_file(data, size);
  if (!console_) return;
  const char* end = data + size;
  while (data < end) {
    const std::size_t room = kMaxLine - partial_line_.size();  // 0 when partial_line_ is full
    const std::size_t span = std::min(static_cast<std::size_t>(end - data), room + 1);
    const char* newline = static_cast<const char*>(std::memchr(data, '\n', span));
    if (!newline && span <= room) {
      partial_line_.append(data, end);
      break;
    }
    // A whole line, or kMaxLine bytes of one that goes on: out it goes, with a newline.
    const char* line_end = newline ? newline + 1 : data + room;
    std::string line = prefix_ + partial_line_;
    line.append(data, line_end);
    if (!newline) line += '\n';
    console_(std::move(line));
    partial_line_.clear();
    data = line_end;
  }
}

void OutputTee::finish() {
  if (console_ && !partial_line_.empty()) {
    console_(prefix_ + partial_line_ + "\n");
    partial_line_.clear();
  }
  source_.close();
  file_.reset();
  if (on_done_) std::exchange(on_done_, nullptr)();
}

}  // namespace ddp::launcher
