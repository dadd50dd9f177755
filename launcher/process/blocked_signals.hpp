#pragma once
// Every signal blocked on the calling thread for a scope, the mask restored after: around the
// clone of a worker or of the group guard, so that no handler of the agent runs in the child
// before the child resets its handlers (Asio's would report the signal to the agent a second
// time through its signal pipe). Internal to the launcher.

#include <signal.h>

namespace ddp::launcher {

class BlockAllSignals {
 public:
  BlockAllSignals() {
    sigset_t all;
    ::sigfillset(&all);
    ::pthread_sigmask(SIG_SETMASK, &all, &saved_);
  }
  ~BlockAllSignals() { ::pthread_sigmask(SIG_SETMASK, &saved_, nullptr); }
  BlockAllSignals(const BlockAllSignals&) = delete;
  BlockAllSignals& operator=(const BlockAllSignals&) = delete;

 private:
  sigset_t saved_;
};

}  // namespace ddp::launcher
