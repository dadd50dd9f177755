// OutputTee: every byte to the file, whole prefixed lines to the console.
#include "ddp/launcher/output_tee.hpp"

#include <fcntl.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "test_support.hpp"

using namespace ddp::launcher;

namespace {

// A console sink that writes each line to fd at once.
ConsoleSink to_fd(int fd) {
  return [fd](std::string line) { REQUIRE(write_all(fd, line.data(), line.size())); };
}

}  // namespace

TEST_CASE("a tee copies bytes to the file and prefixed whole lines to the console") {
  ddp::test::TempDir dir;
  auto file_path = dir.path() / "stdout.log";
  auto console_path = dir.path() / "console";
  UniqueFd console(::open(console_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644));
  UniqueFd file(::open(file_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644));
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  UniqueFd writer(fds[1]);

  boost::asio::io_context io;
  bool done = false;
  OutputTee::start(io, UniqueFd(fds[0]), std::move(file), to_fd(console.get()),
                   "[w3]:", [&] { done = true; });
  // A line split over several writes, an empty line, and a last line without a newline.
  for (const char* chunk : {"hel", "lo\nwor", "ld\n\nta", "il"}) {
    REQUIRE(write_all(writer.get(), chunk, std::strlen(chunk)));
    io.run_one();  // one read per chunk
  }
  writer.reset();
  io.run();
  CHECK(done);
  CHECK(ddp::test::read_file(file_path) == "hello\nworld\n\ntail");
  CHECK(ddp::test::read_file(console_path) == "[w3]:hello\n[w3]:world\n[w3]:\n[w3]:tail\n");
}

TEST_CASE("a tee without console writes only the file") {
  ddp::test::TempDir dir;
  auto file_path = dir.path() / "err.log";
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  UniqueFd writer(fds[1]);
  boost::asio::io_context io;
  OutputTee::start(io, UniqueFd(fds[0]),
                   UniqueFd(::open(file_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644)), nullptr,
                   "[x]:", nullptr);
  std::string big(200000, 'a');
  big += "\n";
  REQUIRE(write_all(writer.get(), big.data(), 65536));  // the pipe holds 64 KiB
  writer.reset();
  io.run();
  CHECK(ddp::test::read_file(file_path).size() == 65536);
}

TEST_CASE("a tee bounds a line without newline: it goes out in pieces of at most kMaxLine") {
  // Binary output or a progress bar drawn with '\r' never ends its line: the tee must not
  // hold it all in memory (nor keep it off the console) until the stream ends.
  ddp::test::TempDir dir;
  auto console_path = dir.path() / "console";
  UniqueFd console(::open(console_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644));
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  UniqueFd writer(fds[1]);
  boost::asio::io_context io;
  OutputTee::start(io, UniqueFd(fds[0]), UniqueFd(), to_fd(console.get()), "[p]:", nullptr);
  const std::size_t total = 3 * OutputTee::kMaxLine + 100;
  std::string chunk(4096, 'x');
  for (std::size_t sent = 0; sent < total; sent += chunk.size()) {
    const std::size_t n = std::min(chunk.size(), total - sent);
    REQUIRE(write_all(writer.get(), chunk.data(), n));
    io.run_one();
  }
  const std::string piece = "[p]:" + std::string(OutputTee::kMaxLine, 'x') + "\n";
  CHECK(ddp::test::read_file(console_path) == piece + piece + piece);  // before the stream ends
  writer.reset();
  io.run();
  CHECK(ddp::test::read_file(console_path) ==
        piece + piece + piece + "[p]:" + std::string(100, 'x') + "\n");
}

TEST_CASE("a full disk: said once, the console goes on, later output is tried again, and listed") {
  ddp::test::TempDir dir;
  auto console_path = dir.path() / "console";
  UniqueFd console(::open(console_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644));
  UniqueFd full(::open("/dev/full", O_WRONLY));  // every write fails with ENOSPC
  REQUIRE(full.valid());
  std::vector<std::string> notices;
  auto errors = std::make_shared<LogFileErrors>([&](std::string line) { notices.push_back(line); });
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  UniqueFd writer(fds[1]);
  boost::asio::io_context io;
  OutputTee::start(
      io, UniqueFd(fds[0]), std::move(full), to_fd(console.get()), "[w0]:", [] {},
      TeeLog{"/dev/full", errors});
  for (const char* chunk : {"a\n", "bb\n", "ccc\n"}) {
    REQUIRE(write_all(writer.get(), chunk, std::strlen(chunk)));
    io.run_one();
  }
  writer.reset();
  io.run();
  CHECK(ddp::test::read_file(console_path) == "[w0]:a\n[w0]:bb\n[w0]:ccc\n");
  REQUIRE(notices.size() == 1);  // once, with the file, the error and the bytes lost
  CHECK_THAT(notices[0], Catch::Contains("/dev/full") &&
                             Catch::Contains("No space left on device") &&
                             Catch::Contains("2 bytes not written"));
  // Every later chunk was tried again (and failed again): 2 + 3 + 4 bytes are missing.
  CHECK(errors->take_incomplete_files_notice() ==
        "ddprun: incomplete log files (writes failed): /dev/full (9 bytes missing)");
  CHECK(errors->take_incomplete_files_notice().empty());  // said once
  CHECK(LogFileErrors(nullptr).take_incomplete_files_notice().empty());
}

TEST_CASE("the line prefix template is rendered as Python's Template.safe_substitute") {
  const std::map<std::string, std::string> values = {
      {"role_name", "trainer"}, {"rank", "12"}, {"local_rank", "3"}, {"hostname", "r12i0n8"}};
  CHECK(render_prefix_template("${hostname}:${rank}: ", values) == "r12i0n8:12: ");
  CHECK(render_prefix_template("[${role_name}${local_rank}]:", values) == "[trainer3]:");
  CHECK(render_prefix_template("$rank/$local_rank ", values) == "12/3 ");
  CHECK(render_prefix_template("$$rank costs $$5", values) == "$rank costs $5");
  // Unknown names, names in another case and stray '$' stay as written.
  CHECK(render_prefix_template("${nope} $RANK ${rank $ $1 ${}", values) ==
        "${nope} $RANK ${rank $ $1 ${}");
  CHECK(render_prefix_template("$ranks", values) == "$ranks");  // the name is "ranks"
  CHECK(render_prefix_template("end$", values) == "end$");
  CHECK(render_prefix_template("", values).empty());
}
