// Connections beyond the server's descriptor table are served by connection shards (threads
// with their own tables): a server in a child process whose soft RLIMIT_NOFILE is 256 takes
// 1,000 clients through init_process_group's pattern on the store, a SET on one shard wakes
// WAITs on the others, accept failing for want of descriptors (EMFILE) still lets clients in,
// and the shard threads stop cleanly with the server. The server runs in a child because the
// limit is the whole process's: the test's own client sockets must not share it.

#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <catch2/catch.hpp>
#include <cstdio>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "ddp/store/server.hpp"
#include "ddp/store/wire_codec.hpp"
#include "process_harness.hpp"
#include "raw_socket.hpp"
#include "skip.hpp"
#include "store_fixture.hpp"
#include "test_support.hpp"

using namespace ddp::store;
using ddp::test::eventually;
using ddp::test::RawSocket;
using namespace std::chrono_literals;

namespace {

constexpr int kRanks = 1000;
constexpr rlim_t kServerLimit = 256;  // the child server's soft RLIMIT_NOFILE
// How long any one step may take (longer in a sanitized build).
const std::chrono::milliseconds kTimeout = ddp::test::build_timeout(10s);

// One line from fd, or "" on timeout or end of file.
std::string read_line(int fd, std::chrono::milliseconds timeout = kTimeout) {
  std::string line;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd p{fd, POLLIN, 0};
    if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) return {};
    char c = 0;
    if (::read(fd, &c, 1) != 1) return {};
    if (c == '\n') return line;
    line += c;
  }
}

void write_all(int fd, const std::string& text) {
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n <= 0) return;
    done += static_cast<std::size_t>(n);
  }
}

std::string stats_line(const ServerStats& s) {
  std::ostringstream out;
  out << "connections=" << s.connections << " waits=" << s.waits << " accepted=" << s.accepted
      << " rejected=" << s.rejected << " shards=" << s.shards
      << " shard_connections=" << s.shard_connections << "\n";
  return out.str();
}

// The server, in the child: prints "port N", then a stats line for every 's' read from
// control; on 'f' fills what is left of its descriptor table (as if the program had taken it)
// and prints "filled=N"; on 'q' (or the test's end) closes the server and exits: 0, unless
// the sanitizers found a leak.
[[noreturn]] void serve_in_child(int report, int control) {
  rlimit limit{};
  ::getrlimit(RLIMIT_NOFILE, &limit);
  limit.rlim_cur = std::min(limit.rlim_max, kServerLimit);
  if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) ::_exit(2);
  {
    boost::asio::io_context io(1);
    ServerOptions options;
    options.host = "127.0.0.1";
    options.port = 0;
    // Its lines (a shard started, bad bytes) are for whoever reads a failed run.
    options.logger = [](std::string_view line) { std::cerr << "server: " << line << std::endl; };
    Server server(io, options);
    write_all(report, "port " + std::to_string(server.port()) + "\n");
    boost::asio::posix::stream_descriptor commands(io, control);
    char command = 0;
    std::function<void()> next;
    auto on_command = [&](const boost::system::error_code& ec, std::size_t) {
      if (!ec && command == 'f') {
        int filled = 0;
        while (::eventfd(0, EFD_CLOEXEC) >= 0) ++filled;
        write_all(report, "filled=" + std::to_string(filled) + "\n");
        return next();
      }
      write_all(report, stats_line(server.stats()));
      if (ec || command == 'q') return server.close();
      next();
    };
    next = [&] { commands.async_read_some(boost::asio::buffer(&command, 1), on_command); };
    next();
    io.run();
  }
  std::exit(0);  // through atexit: the leak check of a sanitized build runs
}

class ChildServer {
 public:
  ChildServer() {
    // A child that died shows as a failed check on its answers, not as this process killed
    // by SIGPIPE on the next command.
    ::signal(SIGPIPE, SIG_IGN);
    int report[2];
    int control[2];
    REQUIRE(::pipe2(report, O_CLOEXEC) == 0);
    REQUIRE(::pipe2(control, O_CLOEXEC) == 0);
    std::cout.flush();  // nothing buffered here may be written twice
    std::fflush(nullptr);
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      ::close(report[0]);
      ::close(control[1]);
      serve_in_child(report[1], control[0]);
    }
    ::close(report[1]);
    ::close(control[0]);
    report_ = report[0];
    control_ = control[1];
    const std::string line = read_line(report_);
    REQUIRE(line.rfind("port ", 0) == 0);
    port_ = static_cast<std::uint16_t>(std::stoi(line.substr(5)));
  }
  ~ChildServer() {
    if (control_ >= 0) ::close(control_);
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    ::close(report_);
  }

  std::uint16_t port() const { return port_; }

  // The server's counters, asked of the child.
  std::map<std::string, std::int64_t> stats() {
    write_all(control_, "s");
    return parse(read_line(report_));
  }

  // Has the child take every descriptor left in its table; how many it took.
  std::int64_t fill_table() {
    write_all(control_, "f");
    return parse(read_line(report_))["filled"];
  }

  // Asks the child to close the server and exit; its last counters and its exit status.
  std::pair<std::map<std::string, std::int64_t>, int> stop() {
    write_all(control_, "q");
    auto last = parse(read_line(report_));
    int status = -1;
    if (ddp::test::wait_for_process_exit(pid_, kTimeout)) {
      ::waitpid(pid_, &status, 0);
      reaped_ = true;
    }
    return {last, status};
  }

 private:
  static std::map<std::string, std::int64_t> parse(const std::string& line) {
    std::map<std::string, std::int64_t> values;
    std::istringstream in(line);
    std::string field;
    while (in >> field) {
      const auto eq = field.find('=');
      if (eq != std::string::npos) values[field.substr(0, eq)] = std::stoll(field.substr(eq + 1));
    }
    return values;
  }

  pid_t pid_ = -1;
  int report_ = -1;
  int control_ = -1;
  bool reaped_ = false;
  std::uint16_t port_ = 0;
};

// Enough descriptors here for the clients, if the hard limit allows.
bool raise_own_limit(rlim_t wanted) {
  rlimit limit{};
  ::getrlimit(RLIMIT_NOFILE, &limit);
  if (limit.rlim_cur >= wanted) return true;
  if (limit.rlim_max < wanted) return false;
  limit.rlim_cur = wanted;
  return ::setrlimit(RLIMIT_NOFILE, &limit) == 0;
}

// A rank's connection: a 2.x client for even ranks, 1.x for odd ones.
struct Rank {
  RawSocket socket;
  Dialect dialect;

  void send(Command command, std::vector<std::string> keys, std::vector<std::string> values = {},
            std::int64_t delta = 0) {
    std::string out;
    encode_request(dialect, make_request(command, std::move(keys), std::move(values), delta), out);
    REQUIRE(socket.send(out));
  }
  std::int64_t read_i64(const char* what) {
    const std::string reply = socket.read(8, kTimeout);
    INFO(what);
    REQUIRE(reply.size() == 8);
    return get_i64(reply.data());
  }
  void read_stop_waiting() { REQUIRE(socket.read(1, kTimeout) == std::string(1, kStopWaiting)); }
};

std::vector<Rank> connect_ranks(std::uint16_t port, int count) {
  std::vector<Rank> ranks;
  ranks.reserve(static_cast<std::size_t>(count));
  for (int r = 0; r < count; ++r) {
    ranks.push_back(Rank{RawSocket(port), r % 2 == 0 ? Dialect::V2 : Dialect::V1});
    if (ranks.back().dialect == Dialect::V2) {
      std::string hello;
      encode_request(Dialect::V2, make_request(Command::Validate, {}, {}, 0, kValidationMagic),
                     hello);
      REQUIRE(ranks.back().socket.send(hello));
    }
  }
  return ranks;
}

// Every rank ADDs 1 to key; the values they got, sorted (1..N when the ADDs were atomic).
std::vector<std::int64_t> count_in(std::vector<Rank>& ranks, const std::string& key) {
  for (Rank& rank : ranks) rank.send(Command::Add, {key}, {}, 1);
  std::vector<std::int64_t> counts;
  for (Rank& rank : ranks) counts.push_back(rank.read_i64(key.c_str()));
  std::sort(counts.begin(), counts.end());
  return counts;
}

bool counts_are_one_to(const std::vector<std::int64_t>& counts, std::int64_t n) {
  if (counts.size() != static_cast<std::size_t>(n)) return false;
  for (std::int64_t i = 0; i < n; ++i) {
    if (counts[static_cast<std::size_t>(i)] != i + 1) return false;
  }
  return true;
}

// Closes the ranks and the server: every close reaches it through the shards, the shard
// threads stop, and the child exits clean.
void close_all(ChildServer& server, std::vector<Rank>& ranks, std::int64_t accepted) {
  ranks.clear();
  REQUIRE(eventually(
      [&] {
        auto now = server.stats();
        return now["connections"] == 0 && now["shard_connections"] == 0;
      },
      kTimeout));
  auto [final_stats, status] = server.stop();
  CHECK(final_stats["accepted"] == accepted);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

constexpr rlim_t kClientDescriptors = kRanks + 512;

}  // namespace

TEST_CASE(
    "server shards: a thousand clients past a 256-descriptor limit do the init_process_group "
    "pattern") {
  if (!raise_own_limit(kClientDescriptors)) {
    return ddp::test::skip("the hard RLIMIT_NOFILE is below the clients' " +
                           std::to_string(kClientDescriptors));
  }
  ChildServer server;
  // Accepted in the order they connect: the first ~220 in the server's own table, then each
  // shard (up to 224 each) filled before the next starts.
  std::vector<Rank> ranks = connect_ranks(server.port(), kRanks);

  // Every rank counts itself in: each value of 1..N exactly once, over all shards.
  CHECK(counts_are_one_to(count_in(ranks, "init/"), kRanks));
  auto stats = server.stats();
  CHECK(stats["accepted"] == kRanks);
  CHECK(stats["shards"] >= 3);
  CHECK(stats["shard_connections"] > kRanks / 2);

  // The unique id: every other rank waits for it (all pending, on every shard) before rank 0,
  // in the server's own table, sets it; then each gets it.
  const std::string unique_id(128, '\x42');
  for (int r = 1; r < kRanks; ++r) ranks[static_cast<std::size_t>(r)].send(Command::Wait, {"uid"});
  REQUIRE(eventually([&] { return server.stats()["waits"] == kRanks - 1; }, kTimeout));
  ranks[0].send(Command::Set, {"uid"}, {unique_id});
  for (int r = 1; r < kRanks; ++r) {
    Rank& rank = ranks[static_cast<std::size_t>(r)];
    rank.read_stop_waiting();
    rank.send(Command::Get, {"uid"});
    const std::string reply = rank.socket.read(8 + unique_id.size(), kTimeout);
    REQUIRE(reply.size() == 8 + unique_id.size());
    REQUIRE(reply.substr(8) == unique_id);
  }

  // The store barrier (c10d's): ADD, the last one in sets the done key, everyone WAITs on it.
  for (Rank& rank : ranks) rank.send(Command::Add, {"barrier"}, {}, 1);
  std::size_t last = ranks.size();
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    if (ranks[r].read_i64("barrier") == kRanks) last = r;
  }
  REQUIRE(last < ranks.size());
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    if (r != last) ranks[r].send(Command::Wait, {"barrier/done"});
  }
  REQUIRE(eventually([&] { return server.stats()["waits"] == kRanks - 1; }, kTimeout));
  ranks[last].send(Command::Set, {"barrier/done"}, {"1"});
  ranks[last].send(Command::Wait, {"barrier/done"});
  for (Rank& rank : ranks) rank.read_stop_waiting();

  // A SET from one shard wakes a WAIT on another: ranks 500 and 999 are more connections apart
  // than a shard holds, and both are past the server's own table.
  Rank& waiter = ranks[kRanks - 1];
  Rank& setter = ranks[kRanks / 2];
  waiter.send(Command::Wait, {"cross"});
  REQUIRE(eventually([&] { return server.stats()["waits"] == 1; }, kTimeout));
  setter.send(Command::Set, {"cross"}, {"x"});
  waiter.read_stop_waiting();

  // Bad bytes on a shard's connection close that one connection only.
  Rank& bad = ranks[kRanks - 2];
  REQUIRE(bad.socket.send(std::string(1, '\xff')));
  CHECK(bad.socket.closed_by_peer(kTimeout));
  REQUIRE(eventually([&] { return server.stats()["rejected"] == 1; }, kTimeout));
  waiter.send(Command::Add, {"init/"}, {}, 0);
  CHECK(waiter.read_i64("after bad bytes") == kRanks);

  close_all(server, ranks, kRanks);
}

TEST_CASE("server shards: with the table full (EMFILE), late clients still get in") {
  if (ddp::test::sanitized_build()) {
    // UBSan's vptr check opens a pipe to probe memory; in a full table it cannot, and reports
    // every object it then checks as having no valid vptr.
    return ddp::test::skip("a full descriptor table defeats UBSan's vptr check");
  }
  if (!raise_own_limit(kClientDescriptors)) {
    return ddp::test::skip("the hard RLIMIT_NOFILE is below the clients' " +
                           std::to_string(kClientDescriptors));
  }
  ChildServer server;
  constexpr int kEarly = 300;  // the server's own table and part of shard 1
  std::vector<Rank> ranks = connect_ranks(server.port(), kEarly);
  REQUIRE(counts_are_one_to(count_in(ranks, "early"), kEarly));
  const std::int64_t shards_before = server.stats()["shards"];
  REQUIRE(shards_before >= 1);

  // The program takes what its table kept free: accept now fails for want of descriptors,
  // and late ranks get in all the same, through the spare descriptors, onto shards, one of
  // which has to start (more late ranks than shard 1 has room left).
  CHECK(server.fill_table() > 0);
  constexpr int kLate = 250;
  std::vector<Rank> late = connect_ranks(server.port(), kLate);
  CHECK(counts_are_one_to(count_in(late, "late"), kLate));
  auto stats = server.stats();
  CHECK(stats["accepted"] == kEarly + kLate);
  CHECK(stats["shards"] > shards_before);
  for (Rank& rank : late) ranks.push_back(std::move(rank));
  close_all(server, ranks, kEarly + kLate);
}

TEST_CASE("server shards: a server under its descriptor limit starts none") {
  ddp::test::TestServer server;
  std::vector<RawSocket> clients;
  for (int i = 0; i < 64; ++i) clients.emplace_back(server.port());
  REQUIRE(eventually([&] { return server.stats().connections == 64; }));
  CHECK(server.stats().shards == 0);
  CHECK(server.stats().shard_connections == 0);
}
