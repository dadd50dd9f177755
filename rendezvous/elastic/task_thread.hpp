#pragma once
// One thread that runs posted tasks in order. The engine gives each kind of work its own
// (rounds, watching), each with its own store client, so that a blocked WAIT on
// one never holds up another. Private to rendezvous/elastic/.

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace ddp::elastic {

class TaskThread {
 public:
  TaskThread();
  // Drops the tasks still queued, waits for the running one to return (tasks
  // watch the engine's cancel flag) and joins the thread.
  ~TaskThread();
  TaskThread(const TaskThread&) = delete;
  TaskThread& operator=(const TaskThread&) = delete;

  void post(std::function<void()> task);

 private:
  void run();

  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace ddp::elastic
