#pragma once
// Copies one worker stream (the read end of a pipe) to its log file as it arrives and to the
// console one whole line at a time, each line prefixed ("[default0]:"). Lines from different
// workers never interleave mid-line: every console line goes to the console sink whole (the
// agent's sink queues it for its console writer thread, so a console that does not read
// never blocks the agent's loop).

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ddp/launcher/log_file_errors.hpp"
#include "ddp/launcher/unique_fd.hpp"
#include "ddp/launcher/write_all.hpp"

namespace ddp::launcher {

// Receives one whole, prefixed console line (ending in '\n') per call; called on the io
// thread and must not block.
using ConsoleSink = std::function<void(std::string lines)>;

// The log file a tee writes: its path, for messages, and where its failed writes are told.
struct TeeLog {
  std::string path;
  std::shared_ptr<LogFileErrors> errors;  // null: failures are not reported
};

// Back-pressure from the console: called after each read that produced console lines; returns
// true when the console has no room, and then calls resume (from any thread) once it has: the
// tee reads its source no further until then (ConsoleWriter::when_room). Empty: never waits.
using ConsoleGate = std::function<bool(std::function<void()> resume)>;

// --log_line_prefix_template rendered as torchrun's string.Template(...).safe_substitute: $name
// and ${name} are replaced by values[name], "$$" is "$"; an unknown name or a "$" that starts
// no name stays as written.
std::string render_prefix_template(const std::string& text,
                                   const std::map<std::string, std::string>& values);

class OutputTee : public std::enable_shared_from_this<OutputTee> {
 public:
  // The longest console line: a line longer than this (binary output, a progress bar drawn
  // with '\r') goes out in pieces of kMaxLine bytes, each ended with a newline, so that a
  // tee's memory stays bounded and the console keeps showing what the worker writes.
  static constexpr std::size_t kMaxLine = 64 * 1024;

  // Starts reading `source` on io. `file` (may be invalid) receives every byte; console
  // (empty for none) receives prefixed lines; a last line without newline gets one at EOF.
  // A failed file write (a full disk) goes to log.errors; the console goes on, and later
  // output is written to the file again. on_done runs once, after EOF or a read error, when
  // everything has been written. The tee keeps itself alive until then.
  static void start(boost::asio::io_context& io, UniqueFd source, UniqueFd file,
                    ConsoleSink console, std::string prefix, std::function<void()> on_done,
                    TeeLog log = {}, ConsoleGate gate = {});

  OutputTee(boost::asio::io_context& io, UniqueFd source, UniqueFd file, ConsoleSink console,
            std::string prefix, std::function<void()> on_done, TeeLog log, ConsoleGate gate);

 private:
  void read_more();
  // After a read: reads on at once, or once the console has room (gate_).
  void read_on();
  void consume(const char* data, std::size_t size);
  void write_file(const char* data, std::size_t size);
  void finish();

  boost::asio::posix::stream_descriptor source_;
  UniqueFd file_;
  TeeLog log_;
  ConsoleGate gate_;
  ConsoleSink console_;
  std::string prefix_;
  std::function<void()> on_done_;
  std::vector<char> buffer_;
  std::string partial_line_;  // console bytes after the last newline
};

}  // namespace ddp::launcher
