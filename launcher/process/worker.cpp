#include "process/worker.hpp"

#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <cerrno>
#include <csignal>
#include <cstring>

namespace ddp::launcher {

Worker::Worker(boost::asio::io_context& io, int local_rank) : local_rank_(local_rank), pidfd_(io) {}

Worker::~Worker() { kill_and_reap(); }

void Worker::kill_and_reap() {
  if (!running()) return;
  signal_group(SIGKILL);
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  exit_ = WorkerExit{0, SIGKILL, std::chrono::system_clock::now()};
}

void Worker::start(const SpawnOptions& options, ExitHandler on_exit) {
  spawned_ = spawn_process(options);
  adopt(spawned_.pid, std::move(on_exit));
}

void Worker::adopt(pid_t pid, ExitHandler on_exit) {
  on_exit_ = std::move(on_exit);
  pid_ = pid;
  int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
  if (fd < 0) {
    int error = errno;
    signal_group(SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = 0;
    throw SpawnError("pidfd_open failed (ddprun needs Linux 5.3 or newer): " +
                     std::string(std::strerror(error)));
  }
  pidfd_.assign(fd);
  watch();
}

void Worker::confirm_started() { confirm_exec(spawned_); }

void Worker::watch() {
  pidfd_.async_wait(boost::asio::posix::stream_descriptor::wait_read,
                    [self = shared_from_this()](boost::system::error_code ec) {
                      if (ec || !self->running()) return;
                      if (!self->poll_exit()) self->watch();
                    });
}

bool Worker::poll_exit() {
  if (exit_) return true;
  if (pid_ <= 0) return false;
  int status = 0;
  pid_t r;
  do {
    r = ::waitpid(pid_, &status, WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r == 0) return false;
  WorkerExit exit;
  exit.time = std::chrono::system_clock::now();
  if (r > 0 && WIFSIGNALED(status)) {
    exit.signal = WTERMSIG(status);
  } else if (r > 0) {
    exit.exit_code = WEXITSTATUS(status);
  } else {
    exit.exit_code = 127;  // reaped by someone else: status unknown
  }
  exit_ = exit;
  boost::system::error_code ignored;
  pidfd_.close(ignored);
  boost::asio::post(pidfd_.get_executor(), [self = shared_from_this()] {
    if (self->on_exit_) std::exchange(self->on_exit_, nullptr)(*self);
  });
  return true;
}

void Worker::signal_group(int signal) const {
  if (pid_ <= 0) return;
  // ESRCH: the group is gone, or not made yet (the child has not reached its setsid). The
  // pid itself is ours to signal only until it is reaped.
  if (::kill(-pid_, signal) != 0 && errno == ESRCH && !exit_) ::kill(pid_, signal);
}

}  // namespace ddp::launcher
