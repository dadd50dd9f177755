#pragma once
// A c10d store (2.x dialect) that lets clients connect and then never answers: it accepts
// every connection and answers the handshake's PING, but reads every other request without
// replying, as a store behind a dead network path or a stalled process would. It counts
// those requests, so that a test can wait until its clients are blocked on one. For tests of
// what an agent does when its rendezvous store stops answering.

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace ddp::test {

class MuteStore {
 public:
  MuteStore();   // listens on 127.0.0.1 at a port the kernel picks
  ~MuteStore();  // stops its thread and closes every connection
  MuteStore(const MuteStore&) = delete;
  MuteStore& operator=(const MuteStore&) = delete;

  int port() const { return port_; }
  // Waits until at least n requests that get no answer have arrived; false on timeout.
  bool wait_for_unanswered(int n, std::chrono::milliseconds timeout);

 private:
  void run();  // its thread: poll over the listener, the connections and the stop pipe

  int listen_fd_ = -1;
  int stop_pipe_[2] = {-1, -1};
  int port_ = 0;
  std::mutex mutex_;
  std::condition_variable changed_;
  int unanswered_ = 0;
  std::thread thread_;
};

}  // namespace ddp::test
