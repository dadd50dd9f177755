#pragma once
// --restart_policy=none: the processes the workers leave behind in sessions of their own (a
// daemon a worker double-forked, as NVIDIA's in-process restart starts one monitor per rank)
// are waited for and reaped by ddprun, so that nothing outlives the job. ddprun is made a child
// subreaper, so that such a process is re-parented to it rather than to init when its parent
// exits (and what a worker left in its own process group, which the worker group then leaves
// running); this class finds them among ddprun's children, has the GroupReaper kill their
// groups if ddprun dies (kill -9), reaps each as it exits, and at the end waits for the rest,
// bounded.
// Internal to the launcher; runs on the agent's loop.

#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "process/group_reaper.hpp"

namespace ddp::launcher {

// How often ddprun looks for new children while the job runs: a daemon a worker started is
// guarded against ddprun's kill -9 within about twice this.
inline constexpr std::chrono::milliseconds kAdoptionScanInterval{250};
// At the job's end, how long the processes the workers left get to exit by themselves before
// SIGTERM (a per-rank monitor exits once its rank has).
inline constexpr std::chrono::milliseconds kAdoptedGrace{5000};

class AdoptedProcesses {
 public:
  // Whether a child of ddprun is one of its own (a worker, the warm template, the reaper's
  // guard): never adopted. Children in ddprun's own session (the tools it runs) never are.
  using IsOwn = std::function<bool(pid_t)>;

  // reaper must outlive this.
  AdoptedProcesses(boost::asio::io_context& io, GroupReaper& reaper, IsOwn is_own);
  // SIGKILLs the groups of the adopted processes still running, and reaps them.
  ~AdoptedProcesses();
  AdoptedProcesses(const AdoptedProcesses&) = delete;
  AdoptedProcesses& operator=(const AdoptedProcesses&) = delete;

  // Makes this process a child subreaper and looks for adopted children every
  // kAdoptionScanInterval. A child is adopted once two looks in a row found it and it was not
  // one of ddprun's own (a warm worker is re-parented to ddprun a moment before ddprun knows
  // its pid).
  void start();
  // Looks for adopted children now.
  void scan();

  // The adopted processes that still run: "pid 4242 (nvrx-monitor), ...".
  std::string describe() const;
  std::size_t running() const { return adopted_.size(); }

  // The job is over: calls done once every adopted process has exited. They get `grace` to
  // exit by themselves, then SIGTERM (to their groups), then SIGKILL after `kill_after`; each
  // step is said in one line through notice. At once when none runs.
  void wait_all(std::chrono::milliseconds grace, std::chrono::milliseconds kill_after,
                std::function<void(const std::string&)> notice, std::function<void()> done);

 private:
  struct Adopted {
    pid_t pgid = 0;  // its process group when adopted
    std::string name;
    std::unique_ptr<boost::asio::posix::stream_descriptor> pidfd;
  };
  void adopt(pid_t pid);
  // The reaper watches each group while an adopted process is in it, or leads it.
  void hold_group(pid_t pgid);
  void release_group(pid_t pgid);
  void on_exit(pid_t pid);
  void signal_all(int signal);
  void schedule_scan();

  boost::asio::io_context& io_;
  GroupReaper& reaper_;
  IsOwn is_own_;
  std::map<pid_t, Adopted> adopted_;
  std::map<pid_t, int> groups_;  // the groups held: how many adopted processes hold each
  std::set<pid_t> seen_once_;    // children found by the last look, not adopted yet
  boost::asio::steady_timer scan_timer_;
  boost::asio::steady_timer wait_timer_;
  std::function<void()> on_all_exited_;
};

}  // namespace ddp::launcher
