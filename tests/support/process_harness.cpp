#include "process_harness.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>

extern char** environ;

namespace ddp::test {
namespace {

int pidfd_open(pid_t pid) { return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)); }

std::vector<std::string> make_env(const std::map<std::string, std::string>& set,
                                  const std::vector<std::string>& unset) {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string entry(*e);
    auto eq = entry.find('=');
    if (eq != std::string::npos) env[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  for (const auto& name : unset) env.erase(name);
  for (const auto& [k, v] : set) env[k] = v;
  std::vector<std::string> out;
  for (const auto& [k, v] : env) out.push_back(k + "=" + v);
  return out;
}

std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (auto& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

milliseconds left(std::chrono::steady_clock::time_point deadline) {
  auto d = std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now());
  return d.count() < 0 ? milliseconds(0) : d;
}

}  // namespace

ChildProcess::ChildProcess(const std::vector<std::string>& argv_in,
                           const std::map<std::string, std::string>& env_set,
                           const std::vector<std::string>& unset) {
  std::vector<std::string> argv = argv_in;
  std::vector<std::string> env = make_env(env_set, unset);
  auto c_argv = c_strings(argv);
  auto c_env = c_strings(env);
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) {
    throw std::runtime_error("pipe failed");
  }
  pid_ = ::fork();
  if (pid_ == 0) {
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    ::execve(c_argv[0], c_argv.data(), c_env.data());
    ::_exit(127);
  }
  ::close(out[1]);
  ::close(err[1]);
  out_fd_ = out[0];
  err_fd_ = err[0];
  pidfd_ = pidfd_open(pid_);
}

ChildProcess::~ChildProcess() {
  if (!status_ && pid_ > 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  for (int fd : {out_fd_, err_fd_, pidfd_}) {
    if (fd >= 0) ::close(fd);
  }
}

void ChildProcess::signal(int sig) const { ::kill(pid_, sig); }

bool ChildProcess::pump(std::chrono::steady_clock::time_point deadline) {
  pollfd fds[3] = {{out_fd_, POLLIN, 0}, {err_fd_, POLLIN, 0}, {status_ ? -1 : pidfd_, POLLIN, 0}};
  int n = ::poll(fds, 3, static_cast<int>(left(deadline).count()));
  if (n <= 0) return n < 0 && errno == EINTR;
  char buffer[65536];
  int* fd_of[2] = {&out_fd_, &err_fd_};
  std::string* text_of[2] = {&out_, &err_};
  for (int i = 0; i < 2; ++i) {
    if (*fd_of[i] < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
    ssize_t got = ::read(*fd_of[i], buffer, sizeof buffer);
    if (got > 0) {
      text_of[i]->append(buffer, static_cast<std::size_t>(got));
    } else {
      ::close(*fd_of[i]);
      *fd_of[i] = -1;
    }
  }
  if (fds[2].revents & POLLIN) {
    int status = 0;
    ::waitpid(pid_, &status, 0);
    status_ = WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
  }
  return true;
}

std::vector<std::string> ChildProcess::wait_for_stdout_lines(const std::string& needle,
                                                             std::size_t count,
                                                             milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    std::vector<std::string> found;
    for (const auto& line : lines_of(out_)) {
      if (line.find(needle) != std::string::npos) found.push_back(line);
    }
    if (found.size() >= count) return found;
    if (out_fd_ < 0 || !pump(deadline)) {
      throw std::runtime_error("waited for " + std::to_string(count) + " stdout lines with '" +
                               needle + "'; got stdout:\n" + out_ + "\nstderr:\n" + err_);
    }
  }
}

std::string ChildProcess::next_stdout_line(milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    std::size_t newline = out_.find('\n', out_taken_);
    if (newline != std::string::npos || out_fd_ < 0) {
      std::size_t end = newline == std::string::npos ? out_.size() : newline;
      std::string line = out_.substr(out_taken_, end - out_taken_);
      out_taken_ = newline == std::string::npos ? out_.size() : newline + 1;
      return line;
    }
    if (!pump(deadline)) {
      throw std::runtime_error("waited for a stdout line of process " + std::to_string(pid_) +
                               "; got stdout:\n" + out_ + "\nstderr:\n" + err_);
    }
  }
}

void ChildProcess::wait_for_stderr(const std::string& needle, milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (err_.find(needle) == std::string::npos) {
    if (err_fd_ < 0 || !pump(deadline)) {
      throw std::runtime_error("waited for stderr '" + needle + "'; got:\n" + err_);
    }
  }
}

ProcessResult ChildProcess::wait(milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!status_ || out_fd_ >= 0 || err_fd_ >= 0) {
    if (!pump(deadline)) {
      throw std::runtime_error("process " + std::to_string(pid_) + " did not finish in " +
                               std::to_string(timeout.count()) + " ms; stdout:\n" + out_ +
                               "\nstderr:\n" + err_);
    }
  }
  return {*status_, out_, err_};
}

ProcessResult run_process(const std::vector<std::string>& argv,
                          const std::map<std::string, std::string>& env,
                          const std::vector<std::string>& unset, milliseconds timeout) {
  ChildProcess child(argv, env, unset);
  return child.wait(timeout);
}

bool wait_for_process_exit(pid_t pid, milliseconds timeout) {
  int fd = pidfd_open(pid);
  if (fd < 0) return errno == ESRCH;
  pollfd p{fd, POLLIN, 0};
  int n;
  do {
    n = ::poll(&p, 1, static_cast<int>(timeout.count()));
  } while (n < 0 && errno == EINTR);
  ::close(fd);
  return n == 1;
}

std::vector<pid_t> live_processes_in_group(pid_t pgid) {
  std::vector<pid_t> pids;
  std::unique_ptr<DIR, int (*)(DIR*)> proc(::opendir("/proc"), ::closedir);
  if (!proc) return pids;
  while (dirent* entry = ::readdir(proc.get())) {
    pid_t pid = static_cast<pid_t>(std::atoi(entry->d_name));
    if (pid <= 0) continue;
    // read(2), not a stream: a process that exits while it is read fails the read with ESRCH,
    // which libstdc++'s filebuf turns into an exception.
    std::string text;
    const int fd = ::open(("/proc/" + std::string(entry->d_name) + "/stat").c_str(), O_RDONLY);
    if (fd < 0) continue;
    char buffer[1024];
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    ::close(fd);
    if (n <= 0) continue;
    text.assign(buffer, static_cast<std::size_t>(n));
    auto close_paren = text.rfind(')');
    if (close_paren == std::string::npos) continue;
    std::istringstream fields(text.substr(close_paren + 2));
    char state = 0;
    long ppid = 0, group = 0;
    fields >> state >> ppid >> group;
    if (group == pgid && state != 'Z' && state != 'X') pids.push_back(pid);
  }
  return pids;
}

bool wait_for_group_exit(pid_t pgid, milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    auto live = live_processes_in_group(pgid);
    if (live.empty()) return true;
    auto left =
        std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    for (pid_t pid : live) {
      if (!wait_for_process_exit(pid, left)) return false;
    }
  }
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) lines.push_back(line);
  return lines;
}

long field_of(const std::string& line, const std::string& key) {
  auto at = line.find(key + "=");
  if (at == std::string::npos) throw std::runtime_error("no " + key + "= in: " + line);
  return std::stol(line.substr(at + key.size() + 1));
}

}  // namespace ddp::test
