#include "ddp/launcher/output_tee.hpp"

#include <algorithm>
#include <boost/asio/post.hpp>
#include <cctype>
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

namespace {

bool starts_name(char c) { return c == '_' || std::isalpha(static_cast<unsigned char>(c)) != 0; }
bool continues_name(char c) { return starts_name(c) || (c >= '0' && c <= '9'); }

}  // namespace

std::string render_prefix_template(const std::string& text,
                                   const std::map<std::string, std::string>& values) {
  std::string out;
  std::size_t i = 0;
  while (i < text.size()) {
    if (text[i] != '$' || i + 1 == text.size()) {
      out += text[i++];
      continue;
    }
    if (text[i + 1] == '$') {  // "$$"
      out += '$';
      i += 2;
      continue;
    }
    const bool braced = text[i + 1] == '{';
    const std::size_t begin = i + (braced ? 2 : 1);
    std::size_t end = begin;
    if (end < text.size() && starts_name(text[end])) {
      while (end < text.size() && continues_name(text[end])) ++end;
    }
    const bool closed = !braced || (end < text.size() && text[end] == '}');
    auto value = values.find(text.substr(begin, end - begin));
    if (end == begin || !closed || value == values.end()) {  // left as written
      out += text[i++];
      continue;
    }
    out += value->second;
    i = end + (braced ? 1 : 0);
  }
  return out;
}

}  // namespace ddp::launcher
