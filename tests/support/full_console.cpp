#include "full_console.hpp"

#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <csignal>

#include "process_harness.hpp"

namespace ddp::test {

void read_fd_until(int fd, const std::string& needle, std::string& text) {
  const auto deadline = std::chrono::steady_clock::now() + kProcessTimeout;
  while (needle.empty() || text.find(needle) == std::string::npos) {
    const auto left =
        std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now());
    INFO("waiting for " << (needle.empty() ? "EOF" : needle) << "; got " << text.size()
                        << " bytes: " << text.substr(0, 2000));
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

FullConsoleProcess::FullConsoleProcess(const std::vector<std::string>& argv, Full full) {
  int out[2], err[2];
  REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
  REQUIRE(::pipe2(err, O_CLOEXEC) == 0);
  const int filled = full == Full::kStdout ? out[1] : err[1];
  const std::string block(PIPE_BUF, 'f');
  REQUIRE(::fcntl(filled, F_SETFL, O_NONBLOCK) == 0);
  while (::write(filled, block.data(), block.size()) > 0) {
  }
  REQUIRE(::fcntl(filled, F_SETFL, 0) == 0);

  std::vector<std::string> args = argv;
  std::vector<char*> c_argv;
  for (auto& arg : args) c_argv.push_back(arg.data());
  c_argv.push_back(nullptr);
  pid_ = ::fork();
  REQUIRE(pid_ >= 0);
  if (pid_ == 0) {
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    ::execv(c_argv[0], c_argv.data());
    ::_exit(127);
  }
  ::close(out[1]);
  ::close(err[1]);
  out_fd_ = out[0];
  err_fd_ = err[0];
}

FullConsoleProcess::~FullConsoleProcess() {
  // When a REQUIRE failed: the agent's death makes its reaper kill the workers.
  if (!reaped_ && pid_ > 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  ::close(out_fd_);
  ::close(err_fd_);
}

const std::string& FullConsoleProcess::read_stdout_until(const std::string& needle) {
  read_fd_until(out_fd_, needle, out_);
  return out_;
}

const std::string& FullConsoleProcess::read_stderr_until(const std::string& needle) {
  read_fd_until(err_fd_, needle, err_);
  return err_;
}

int FullConsoleProcess::wait() {
  // Both streams at once: the process may be blocked on either one.
  const auto deadline = std::chrono::steady_clock::now() + kProcessTimeout;
  bool out_open = true, err_open = true;
  while (out_open || err_open) {
    const auto left =
        std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now());
    INFO("waiting for the end of the output of pid " << pid_);
    REQUIRE(left.count() > 0);
    pollfd fds[2] = {{out_open ? out_fd_ : -1, POLLIN, 0}, {err_open ? err_fd_ : -1, POLLIN, 0}};
    REQUIRE(::poll(fds, 2, static_cast<int>(left.count())) > 0);
    char buffer[65536];
    for (int i = 0; i < 2; ++i) {
      if (fds[i].revents == 0) continue;
      const ssize_t n = ::read(fds[i].fd, buffer, sizeof buffer);
      REQUIRE(n >= 0);
      if (n == 0) {
        (i == 0 ? out_open : err_open) = false;
        continue;
      }
      (i == 0 ? out_ : err_).append(buffer, static_cast<std::size_t>(n));
    }
  }
  int status = 0;
  REQUIRE(::waitpid(pid_, &status, 0) == pid_);
  reaped_ = true;
  return status;
}

const std::string& FullConsoleProcess::stdout_text() const { return out_; }
const std::string& FullConsoleProcess::stderr_text() const { return err_; }

}  // namespace ddp::test
