// ddprun whose console (stderr) is a full pipe that nobody reads: the agent's store logs a bad
// client, a worker fails, and the agent still stops the group at once, because all of its
// console output is queued by its console writer and never written on the event loop.
#include <arpa/inet.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <csignal>
#include <string>

#include "multi_node_harness.hpp"

using namespace ddp::test;

namespace {

// Reads fd onto text until text contains needle (needle empty: until EOF); fails on timeout.
void read_fd_until(int fd, const std::string& needle, std::string& text) {
  const auto deadline = std::chrono::steady_clock::now() + kProcessTimeout;
  while (needle.empty() || text.find(needle) == std::string::npos) {
    const auto left =
        std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now());
    INFO("waiting for " << (needle.empty() ? "EOF" : needle) << "; got: " << text);
    REQUIRE(left.count() > 0);
    pollfd readable{fd, POLLIN, 0};
    REQUIRE(::poll(&readable, 1, static_cast<int>(left.count())) == 1);
    char buffer[65536];
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    REQUIRE(n >= 0);
    if (n == 0) break;
    text.append(buffer, static_cast<std::size_t>(n));
  }
}

// Connects to 127.0.0.1:port, sends bytes that are no store request, and waits (bounded)
// until the store closes the connection. True if it did.
bool send_garbage(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  const std::string garbage(256, '\xff');
  REQUIRE(::write(fd, garbage.data(), garbage.size()) == static_cast<ssize_t>(garbage.size()));
  pollfd closed{fd, POLLIN, 0};
  char byte;
  const bool ended = ::poll(&closed, 1, static_cast<int>(kProcessTimeout.count())) == 1 &&
                     ::read(fd, &byte, 1) <= 0;
  ::close(fd);
  return ended;
}

}  // namespace

TEST_CASE("a full console and a bad store client: a failing worker still stops the group at once") {
  TempDir dir;
  int out[2], err[2];
  REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
  REQUIRE(::pipe2(err, O_CLOEXEC) == 0);
  const std::string block(PIPE_BUF, 'f');
  REQUIRE(::fcntl(err[1], F_SETFL, O_NONBLOCK) == 0);
  while (::write(err[1], block.data(), block.size()) > 0) {
  }
  REQUIRE(::fcntl(err[1], F_SETFL, 0) == 0);

  // Rank 0 says hello (with the store's port), waits for "go" and fails; rank 1 waits.
  const auto go = dir.path() / "go";
  std::vector<std::string> argv = ddprun({"--nproc_per_node=2", "--monitor_interval=0.1"},
                                         {"--hello", "--ready", "--if-rank", "0", "--wait-for-file",
                                          go.string(), "--if-rank", "0", "--exit", "3", "--wait"});
  std::vector<char*> c_argv;
  for (auto& arg : argv) c_argv.push_back(arg.data());
  c_argv.push_back(nullptr);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    ::execv(c_argv[0], c_argv.data());
    ::_exit(127);
  }
  ::close(out[1]);
  ::close(err[1]);
  struct Cleanup {  // when a REQUIRE fails: ddprun's death makes its reaper kill the workers
    pid_t pid;
    int fds[2];
    bool reaped = false;
    ~Cleanup() {
      if (!reaped) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
      }
      for (int fd : fds) ::close(fd);
    }
  } cleanup{pid, {out[0], err[0]}};

  std::string out_text;
  read_fd_until(out[0], "ready rank=1 ", out_text);
  read_fd_until(out[0], "ready rank=0 ", out_text);  // after rank 0's hello, which has the port
  INFO("stdout: " << out_text);
  const auto at = out_text.find("master 127.0.0.1:");
  const int port = std::stoi(out_text.substr(at + std::string("master 127.0.0.1:").size()));
  const auto ready_1 = out_text.find("ready rank=1 ");
  const pid_t waiter = static_cast<pid_t>(
      field_of(out_text.substr(ready_1, out_text.find('\n', ready_1) - ready_1), "pid"));

  CHECK(send_garbage(port));  // the store logs it to the full console, and closes it
  touch(go);                  // rank 0 fails
  CHECK(wait_for_process_exit(waiter, milliseconds(10000)));  // the group is stopped

  std::string err_text;
  read_fd_until(err[0], "", err_text);  // lets ddprun finish
  read_fd_until(out[0], "", out_text);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  cleanup.reaped = true;
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 3);
  const std::string console = err_text.substr(err_text.find_first_not_of('f'));
  INFO("stderr after the filler: " << console);
  CHECK_THAT(console, Catch::Contains("closed connection from 127.0.0.1"));
  CHECK_THAT(console, Catch::Contains("exit code 3"));
}
