#pragma once
// One running worker process, as the agent sees it: its pid (= process group id), an event
// when it exits (a pidfd watched by the io_context; no SIGCHLD handler, no polling), and its
// exit status. Internal to the launcher library.

#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>

#include "ddp/launcher/spawn_process.hpp"

namespace ddp::launcher {

struct WorkerExit {
  int exit_code = 0;  // when it exited normally
  int signal = 0;     // when a signal killed it
  std::chrono::system_clock::time_point time;
  bool failed() const { return signal != 0 || exit_code != 0; }
};

class Worker : public std::enable_shared_from_this<Worker> {
 public:
  using ExitHandler = std::function<void(Worker&)>;

  Worker(boost::asio::io_context& io, int local_rank);
  ~Worker();  // a worker still running is killed (whole group) and reaped
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Spawns the process (throws SpawnError) and calls on_exit once, from the io_context,
  // when it has exited and been reaped. Returns once the child has exec'd or failed to
  // (spawn_process); call confirm_started() to learn which. Call once.
  void start(const SpawnOptions& options, ExitHandler on_exit);

  // Watches pid, a child of this process started another way (forked by the warm template), as
  // start() watches its own. Throws SpawnError when pidfd_open fails. Call once, instead of
  // start().
  void adopt(pid_t pid, ExitHandler on_exit);

  // Throws SpawnError when the exec of start() failed.
  void confirm_started();

  // Reaps the process if it has already exited, without waiting; true once it has exited
  // (on_exit then runs from the io_context as usual).
  bool poll_exit();

  // SIGKILLs the whole group and reaps the process if still running. Returns promptly:
  // SIGKILL cannot be caught.
  void kill_and_reap();

  // Sends signal to the worker's whole process group (its children included). Harmless
  // when the group is gone.
  void signal_group(int signal) const;

  int local_rank() const { return local_rank_; }
  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0 && !exit_; }
  const std::optional<WorkerExit>& exit() const { return exit_; }

 private:
  void watch();

  int local_rank_;
  pid_t pid_ = 0;
  SpawnedProcess spawned_;
  boost::asio::posix::stream_descriptor pidfd_;
  std::optional<WorkerExit> exit_;
  ExitHandler on_exit_;
};

}  // namespace ddp::launcher
