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

#include "full_console.hpp"
#include "multi_node_harness.hpp"

using namespace ddp::test;

namespace {

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
  // Rank 0 says hello (with the store's port), waits for "go" and fails; rank 1 waits.
  const auto go = dir.path() / "go";
  FullConsoleProcess agent(ddprun({"--nproc_per_node=2", "--monitor_interval=0.1"},
                                  {"--hello", "--ready", "--if-rank", "0", "--wait-for-file",
                                   go.string(), "--if-rank", "0", "--exit", "3", "--wait"}),
                           FullConsoleProcess::Full::kStderr);

  agent.read_stdout_until("ready rank=1 ");
  // After rank 0's hello, which has the port.
  const std::string out_text = agent.read_stdout_until("ready rank=0 ");
  INFO("stdout: " << out_text);
  const auto at = out_text.find("master 127.0.0.1:");
  const int port = std::stoi(out_text.substr(at + std::string("master 127.0.0.1:").size()));
  const auto ready_1 = out_text.find("ready rank=1 ");
  const pid_t waiter = static_cast<pid_t>(
      field_of(out_text.substr(ready_1, out_text.find('\n', ready_1) - ready_1), "pid"));

  CHECK(send_garbage(port));  // the store logs it to the full console, and closes it
  touch(go);                  // rank 0 fails
  CHECK(wait_for_process_exit(waiter, milliseconds(10000)));  // the group is stopped

  const int status = agent.wait();  // reads the console to its end, which lets ddprun finish
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 3);
  const std::string err_text = agent.stderr_text();
  const std::string console = err_text.substr(err_text.find_first_not_of('f'));
  INFO("stderr after the filler: " << console);
  CHECK_THAT(console, Catch::Contains("closed connection from 127.0.0.1"));
  CHECK_THAT(console, Catch::Contains("exit code 3"));
}
