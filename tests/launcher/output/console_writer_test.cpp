// ConsoleWriter: never blocks its caller, says when a console that does not read holds too
// much (and when it has room again), drops nothing, keeps order, and gives up on a broken
// console.
#include "output/console_writer.hpp"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <csignal>
#include <future>
#include <regex>
#include <sstream>

#include "ddp/launcher/unique_fd.hpp"

using namespace ddp::launcher;
using namespace std::chrono_literals;
using ddp::launcher::UniqueFd;

namespace {

constexpr auto kWait = 10s;  // how long a test waits for the writer thread

struct Pipe {
  UniqueFd read_end;
  UniqueFd write_end;
  Pipe() {
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    read_end = UniqueFd(fds[0]);
    write_end = UniqueFd(fds[1]);
  }
};

const std::string kFiller = std::string(PIPE_BUF - 1, 'f') + "\n";

// Fills the pipe up to its capacity (in PIPE_BUF blocks, which go in whole or not at all), so
// that the next blocking write to it waits for a reader.
void fill(int write_fd) {
  const int flags = ::fcntl(write_fd, F_GETFL);
  REQUIRE(::fcntl(write_fd, F_SETFL, flags | O_NONBLOCK) == 0);
  while (::write(write_fd, kFiller.data(), kFiller.size()) > 0) {
  }
  REQUIRE(errno == EAGAIN);
  REQUIRE(::fcntl(write_fd, F_SETFL, flags) == 0);
}

// Reads fd until `text` ends with a line containing needle; fails on timeout or EOF.
std::string read_until_line_with(int fd, const std::string& needle) {
  std::string text;
  const auto deadline = std::chrono::steady_clock::now() + kWait;
  for (;;) {
    const auto last_line_start = text.rfind('\n', text.size() >= 2 ? text.size() - 2 : 0);
    if (!text.empty() && text.back() == '\n' &&
        text.find(needle, last_line_start == std::string::npos ? 0 : last_line_start) !=
            std::string::npos) {
      return text;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd readable{fd, POLLIN, 0};
    INFO("waiting for a line with: " << needle);
    REQUIRE(left.count() > 0);
    REQUIRE(::poll(&readable, 1, static_cast<int>(left.count())) == 1);
    char buffer[65536];
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    REQUIRE(n > 0);
    text.append(buffer, static_cast<std::size_t>(n));
  }
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// "line 0042 ....": 42.
std::string numbered_line(int i) {
  char head[16];
  std::snprintf(head, sizeof head, "line %04d ", i);
  return head + std::string(89, 'x') + "\n";  // 100 bytes
}

}  // namespace

TEST_CASE(
    "an unread console: writes return, past the bound it has no room until it took half, "
    "and nothing is dropped") {
  std::signal(SIGPIPE, SIG_IGN);
  Pipe pipe;
  constexpr std::size_t kBound = 4096;
  constexpr int kLines = 5000;  // 500 KB: far more than the pipe (64 KiB) and the bound hold
  fill(pipe.write_end.get());
  ConsoleWriter writer(kBound);
  CHECK(writer.has_room());
  std::promise<void> room;
  for (int i = 0; i < kLines; ++i) writer.write_line(pipe.write_end.get(), numbered_line(i));
  writer.write_notice(pipe.write_end.get(), "a notice\n");
  // Everything above returned although nobody reads the pipe; the tees would pause now.
  CHECK_FALSE(writer.has_room());
  REQUIRE(writer.when_room([&] { room.set_value(); }));
  auto resumed = room.get_future();
  CHECK(resumed.wait_for(0s) != std::future_status::ready);

  auto flushed = std::async(std::launch::async, [&] { writer.flush(); });
  CHECK(flushed.wait_for(0s) != std::future_status::ready);  // the pipe is full

  const std::string text = read_until_line_with(pipe.read_end.get(), "a notice");
  REQUIRE(flushed.wait_for(kWait) == std::future_status::ready);
  CHECK(resumed.wait_for(kWait) == std::future_status::ready);  // once half was taken
  CHECK(writer.has_room());
  CHECK_FALSE(writer.when_room([] {}));  // room now: nothing to wait for

  const auto lines = lines_of(text);
  std::size_t i = 0;
  while (i < lines.size() && lines[i] + "\n" == kFiller) ++i;
  int next = 0;
  for (; i < lines.size() && lines[i] != "a notice"; ++i) {
    INFO("line " << i << ": " << lines[i]);
    REQUIRE(lines[i] + "\n" == numbered_line(next));  // every line, whole, in order
    ++next;
  }
  CHECK(next == kLines);
  CHECK(lines.back() == "a notice");
}

TEST_CASE("lines within the bound are all written, in order") {
  Pipe pipe;
  ConsoleWriter writer;
  std::string expected;
  for (int i = 0; i < 100; ++i) {
    writer.write_line(pipe.write_end.get(), numbered_line(i));
    expected += numbered_line(i);
  }
  writer.write_notice(pipe.write_end.get(), "the end\n");
  expected += "the end\n";
  writer.flush();
  CHECK(read_until_line_with(pipe.read_end.get(), "the end") == expected);
}

TEST_CASE("a console whose reader is gone (EPIPE) does not hang flush") {
  std::signal(SIGPIPE, SIG_IGN);
  SECTION("closed before anything is written") {
    Pipe pipe;
    ConsoleWriter writer;
    pipe.read_end.reset();
    for (int i = 0; i < 1000; ++i) writer.write_line(pipe.write_end.get(), numbered_line(i));
    writer.write_notice(pipe.write_end.get(), "report\n");
    writer.flush();
  }
  SECTION("closed while the writer is blocked on a full pipe") {
    Pipe pipe;
    fill(pipe.write_end.get());
    ConsoleWriter writer(4096);
    for (int i = 0; i < 2000; ++i) writer.write_line(pipe.write_end.get(), numbered_line(i));
    writer.write_notice(pipe.write_end.get(), "report\n");
    auto flushed = std::async(std::launch::async, [&] { writer.flush(); });
    CHECK(flushed.wait_for(0s) != std::future_status::ready);
    pipe.read_end.reset();  // the blocked write fails with EPIPE; the rest is given up
    CHECK(flushed.wait_for(kWait) == std::future_status::ready);
  }
}
