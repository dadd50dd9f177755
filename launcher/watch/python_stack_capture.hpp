#pragma once
// Takes the Python stacks of running workers without harming them: each worker whose ddprun
// Python probe registered a stack signal (RecordPage::stack_signal) is sent that signal, and
// faulthandler in the worker writes every thread's stack into the worker's stack file
// (RecordMapping::stacks_since), never onto its stderr. A worker that asked for no signal is
// sent none, nor one that no longer catches it (it exec'd another program) or whose registered
// descriptor (RecordPage::stack_fd) is no longer the stack file: its PythonStack says why. Done
// once every dump has ended: the worker has handled the signal (nothing pending, no thread in the
// handler) and its file grew, or the file stopped growing for kQuiet after it grew, the worker
// exited, or kTimeout passed. Internal to the launcher; runs on the agent's loop.

#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "diagnosis/python_stacks.hpp"
#include "process/record_mapping.hpp"

namespace ddp::launcher {

// The signal ddprun asks the probe to register for its stack dumps (DDPRUN_STACK_SIGNAL): a
// real-time one, SIGRTMIN + 6, which neither Python nor PyTorch uses.
int python_stack_signal();

class PythonStackCapture {
 public:
  struct Target {
    int rank = -1;
    int local_rank = -1;
    pid_t pid = 0;
    std::shared_ptr<const RecordMapping> record;
    std::function<bool()> running;  // false once the worker exited
  };
  // Each target's stack (PythonStack::error says why one has none), in the targets' order.
  using Done = std::function<void(std::vector<PythonStack>)>;

  // How long a dump's file must stay unchanged to count as ended, how often it is looked at,
  // and how long a capture may take in all.
  static constexpr std::chrono::milliseconds kQuiet{60};
  static constexpr std::chrono::milliseconds kPoll{5};
  static constexpr std::chrono::milliseconds kTimeout{2000};

  explicit PythonStackCapture(boost::asio::io_context& io);
  PythonStackCapture(const PythonStackCapture&) = delete;
  PythonStackCapture& operator=(const PythonStackCapture&) = delete;

  // Signals the targets that asked for it and calls done on the loop once each dump ended
  // (at once when none asked). Returns how many were signalled. One capture at a time: a
  // second call while one runs adds nothing and gets an empty result at once.
  int capture(std::vector<Target> targets, Done done);

  // True while pid was signalled and its dump has not ended: a SIGTERM now could cut it.
  bool dumping(pid_t pid) const;

 private:
  struct Dump {
    Target target;
    std::uint64_t offset = 0;                       // the file's size before the signal
    std::uint64_t last_size = 0;                    // at the last look
    std::chrono::steady_clock::time_point changed;  // when it last grew
    std::string refused;  // why it was not signalled though its probe asked ("": it was)
    int signal = 0;
    std::set<pid_t> blocking;  // its threads that blocked the signal before it was sent
    bool signalled = false;
    bool ended = false;
  };
  void poll();
  void finish();

  boost::asio::steady_timer timer_;
  std::vector<Dump> dumps_;
  Done done_;
  std::chrono::steady_clock::time_point deadline_;
  bool active_ = false;
};

}  // namespace ddp::launcher
