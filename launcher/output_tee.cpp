#include "ddp/launcher/output_tee.hpp"

#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

namespace ddp::launcher {

namespace {
constexpr std::size_t kReadChunk = 64 * 1024;
// How long a write waits for a full, non-blocking console (or file) to take more.
constexpr std::chrono::milliseconds kConsoleWriteTimeout{10000};
}  // namespace

bool write_all(int fd, const char* data, std::size_t size) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {  // a non-blocking console
      pollfd writable{fd, POLLOUT, 0};
      if (::poll(&writable, 1, static_cast<int>(kConsoleWriteTimeout.count())) == 1) continue;
      return false;
    }
    if (n <= 0) return false;
    data += n;
    size -= static_cast<std::size_t>(n);
  }
  return true;
}

void OutputTee::start(boost::asio::io_context& io, UniqueFd source, UniqueFd file,
                      ConsoleSink console, std::string prefix, std::function<void()> on_done) {
  auto tee = std::make_shared<OutputTee>(io, std::move(source), std::move(file), std::move(console),
                                         std::move(prefix), std::move(on_done));
  tee->read_more();
}

OutputTee::OutputTee(boost::asio::io_context& io, UniqueFd source, UniqueFd file,
                     ConsoleSink console, std::string prefix, std::function<void()> on_done)
    : source_(io, source.release()),
      file_(std::move(file)),
      console_(std::move(console)),
      prefix_(std::move(prefix)),
      on_done_(std::move(on_done)),
      buffer_(kReadChunk) {}

void OutputTee::read_more() {
  source_.async_read_some(boost::asio::buffer(buffer_),
                          [self = shared_from_this()](boost::system::error_code ec,
                                                      std::size_t n) {
                            if (n > 0) self->consume(self->buffer_.data(), n);
                            if (ec) {
                              self->finish();
                            } else {
                              self->read_more();
                            }
                          });
}

void OutputTee::consume(const char* data, std::size_t size) {
  if (file_.valid() && !write_all(file_.get(), data, size)) file_.reset();
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
