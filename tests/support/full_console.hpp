#pragma once
// A process whose stdout or stderr is a pipe that is already full when it starts and that
// nobody reads until the test says so: an agent that wrote its console on its event loop
// would hang there. Used by the agent tests that prove the console never stalls the agent.

#include <sys/types.h>

#include <string>
#include <vector>

namespace ddp::test {

class FullConsoleProcess {
 public:
  enum class Full { kStdout, kStderr };

  // Starts argv (argv[0] a path) with the `full` stream's pipe filled to the brim.
  FullConsoleProcess(const std::vector<std::string>& argv, Full full);
  // SIGKILLs and reaps the process unless wait() reaped it.
  ~FullConsoleProcess();
  FullConsoleProcess(const FullConsoleProcess&) = delete;
  FullConsoleProcess& operator=(const FullConsoleProcess&) = delete;

  pid_t pid() const { return pid_; }

  // Reads the stream onto its text until that contains needle (needle empty: until EOF);
  // fails the test (REQUIRE) at kProcessTimeout. Returns everything read from it so far.
  const std::string& read_stdout_until(const std::string& needle);
  const std::string& read_stderr_until(const std::string& needle);

  // Reads both streams to EOF, then reaps the process: its exit status (WIFEXITED etc.).
  int wait();
  // Everything read from each stream so far.
  const std::string& stdout_text() const;
  const std::string& stderr_text() const;

 private:
  pid_t pid_ = -1;
  int out_fd_ = -1;
  int err_fd_ = -1;
  bool reaped_ = false;
  std::string out_;
  std::string err_;
};

// Reads fd onto text until text contains needle (needle empty: until EOF); fails the test
// (REQUIRE) at kProcessTimeout.
void read_fd_until(int fd, const std::string& needle, std::string& text);

}  // namespace ddp::test
