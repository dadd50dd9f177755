#pragma once
// Running real processes from tests (ddprun, ddpstore, Python peers): start them with pipes,
// wait for lines and exits as events with deadlines (poll on pipes and pidfds; no fixed
// sleeps), and inspect process groups through /proc. The one ChildProcess of the tests.

#include <sys/types.h>

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ddp::test {

using std::chrono::milliseconds;
inline constexpr milliseconds kProcessTimeout{30000};  // how long a test waits for a process

struct ProcessResult {
  int status = -1;  // exit code, or 128+signal
  std::string out;
  std::string err;
};

// A child process with stdout and stderr on pipes. Killed (SIGKILL) and reaped on
// destruction if still running.
class ChildProcess {
 public:
  // env: variables to set (on top of this process's environment); unset: names to remove.
  explicit ChildProcess(const std::vector<std::string>& argv,
                        const std::map<std::string, std::string>& env = {},
                        const std::vector<std::string>& unset = {});
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  void signal(int sig) const;

  // Reads output until `count` stdout lines contain `needle` (from the start); returns them.
  // Throws std::runtime_error naming what it waited for on timeout or early exit.
  std::vector<std::string> wait_for_stdout_lines(const std::string& needle, std::size_t count,
                                                 milliseconds timeout = kProcessTimeout);
  // The next stdout line (without its newline) not returned by this call before; at the end
  // of the output, what is left (empty when nothing). Throws std::runtime_error on timeout.
  std::string next_stdout_line(milliseconds timeout = kProcessTimeout);
  // Reads until some stderr line contains needle; throws on timeout.
  void wait_for_stderr(const std::string& needle, milliseconds timeout = kProcessTimeout);

  // Waits for the exit and the end of its output; throws std::runtime_error on timeout.
  ProcessResult wait(milliseconds timeout = kProcessTimeout);

 private:
  // One round of poll over the pipes and the pidfd until the deadline; false on timeout.
  bool pump(std::chrono::steady_clock::time_point deadline);

  pid_t pid_ = -1;
  int out_fd_ = -1;
  int err_fd_ = -1;
  int pidfd_ = -1;
  std::optional<int> status_;
  std::string out_;
  std::string err_;
  std::size_t out_taken_ = 0;  // bytes of out_ next_stdout_line has returned
};

// Runs argv to completion.
ProcessResult run_process(const std::vector<std::string>& argv,
                          const std::map<std::string, std::string>& env = {},
                          const std::vector<std::string>& unset = {},
                          milliseconds timeout = kProcessTimeout);

// Waits (pidfd + poll) until process pid, not necessarily our child, has exited; true if it
// did within timeout.
bool wait_for_process_exit(pid_t pid, milliseconds timeout = kProcessTimeout);

// Pids of processes in process group pgid that are not zombies.
std::vector<pid_t> live_processes_in_group(pid_t pgid);

// Waits (a pidfd per member) until no live process is left in group pgid; true if that
// happened within timeout. A SIGKILL sent to a group takes effect a moment later.
bool wait_for_group_exit(pid_t pgid, milliseconds timeout = kProcessTimeout);

// Lines of text.
std::vector<std::string> lines_of(const std::string& text);

// "ready rank=1 pid=1234" -> 1234 (the value after key=).
long field_of(const std::string& line, const std::string& key);

}  // namespace ddp::test
