#include "watch/python_stack_capture.hpp"

#include <csignal>

#include "process/process_status.hpp"

namespace ddp::launcher {

int python_stack_signal() { return SIGRTMIN + 6; }

namespace {

// Why the worker must not be sent its stack signal now, "" when it may: it catches the signal
// (a program that exec'd another, or set the signal's action, would be killed by it), and the
// descriptor its probe registered still is ddprun's stack file (else faulthandler would write
// into whatever file the program opened there). (A worker that execs in the microseconds
// between these reads and the signal is not covered: no signal can be sent conditionally.)
std::string refusal(const PythonStackCapture::Target& target, int signal) {
  if (!catches_signal(target.pid, signal)) {
    return "it no longer handles the stack signal (it exec'd another program or set the "
           "signal's action itself), so ddprun sent it none";
  }
  const int fd = target.record->worker_stack_fd();
  if (!holds_same_file(target.pid, fd, target.record->stack_fd())) {
    return "its stack file is no longer the one ddprun gave it (the program closed or reused "
           "descriptor " +
           std::to_string(fd) + "), so ddprun sent it no signal";
  }
  return "";
}

}  // namespace

PythonStackCapture::PythonStackCapture(boost::asio::io_context& io) : timer_(io) {}

int PythonStackCapture::capture(std::vector<Target> targets, Done done) {
  if (active_) {
    done({});
    return 0;
  }
  dumps_.clear();
  int signalled = 0;
  const auto now = std::chrono::steady_clock::now();
  for (Target& target : targets) {
    Dump dump;
    dump.target = std::move(target);
    dump.changed = now;
    const int signal = dump.target.record ? dump.target.record->stack_signal() : 0;
    if (signal != 0 && dump.target.running()) dump.refused = refusal(dump.target, signal);
    if (signal != 0 && dump.target.running() && dump.refused.empty()) {
      dump.offset = dump.target.record->stack_size();
      dump.last_size = dump.offset;
      dump.signal = signal;
      dump.blocking = threads_blocking(dump.target.pid, signal);
      dump.signalled = ::kill(dump.target.pid, signal) == 0;  // the process only
      signalled += dump.signalled ? 1 : 0;
    }
    dump.ended = !dump.signalled;
    dumps_.push_back(std::move(dump));
  }
  done_ = std::move(done);
  active_ = true;
  deadline_ = now + kTimeout;
  poll();
  return signalled;
}

bool PythonStackCapture::dumping(pid_t pid) const {
  if (!active_) return false;
  for (const Dump& dump : dumps_) {
    if (dump.target.pid == pid) return !dump.ended;
  }
  return false;
}

void PythonStackCapture::poll() {
  const auto now = std::chrono::steady_clock::now();
  bool all_ended = true;
  for (Dump& dump : dumps_) {
    if (dump.ended) continue;
    const std::uint64_t size = dump.target.record->stack_size();
    if (size != dump.last_size) {
      dump.last_size = size;
      dump.changed = now;
    }
    const bool grew = size > dump.offset;
    const bool quiet = grew && now - dump.changed >= kQuiet;
    // faulthandler writes the whole dump inside its handler: once the worker has handled the
    // signal, the dump is complete.
    const bool handled = grew && handled_signal(dump.target.pid, dump.signal, dump.blocking);
    dump.ended = handled || quiet || !dump.target.running() || now >= deadline_;
    all_ended = all_ended && dump.ended;
  }
  if (all_ended) return finish();
  timer_.expires_after(kPoll);
  timer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) poll();
  });
}

void PythonStackCapture::finish() {
  std::vector<PythonStack> stacks;
  for (const Dump& dump : dumps_) {
    PythonStack stack;
    stack.rank = dump.target.rank;
    stack.local_rank = dump.target.local_rank;
    if (!dump.target.record || dump.target.record->stack_signal() == 0) {
      stack.error =
          "ddprun's Python probe is not loaded in it (DDPRUN_PYTHON_PROBE=0, "
          "--skip_python_probe, python -I, or it failed to load: its stderr says why)";
    } else if (!dump.refused.empty()) {
      stack.error = dump.refused;
    } else if (!dump.signalled) {
      stack.error = "it had exited";
    } else {
      stack.dump = faulthandler_threads(dump.target.record->stacks_since(dump.offset));
      if (stack.dump.empty()) {
        stack.error = !dump.target.running()
                          ? kExitedNoFrame
                          : "it wrote no stack within " + std::to_string(kTimeout.count()) + " ms";
      }
    }
    stacks.push_back(std::move(stack));
  }
  active_ = false;
  Done done = std::move(done_);
  done_ = nullptr;
  if (done) done(std::move(stacks));
}

}  // namespace ddp::launcher
