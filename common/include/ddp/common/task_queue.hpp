#pragma once
// A single worker thread that runs submitted tasks in order: the communication thread of the
// Gloo backend. Internal to libddp.

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace ddp::detail {

class TaskQueue {
 public:
  TaskQueue();
  // Runs the tasks still queued, then joins the thread.
  ~TaskQueue();
  TaskQueue(const TaskQueue&) = delete;
  TaskQueue& operator=(const TaskQueue&) = delete;

  // Queues task; it runs after every task submitted before it. Thread-safe. A task must not
  // throw (it reports failures through its own state).
  void submit(std::function<void()> task);

 private:
  void run();

  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  std::thread thread_;  // last: starts after the members it uses exist
};

}  // namespace ddp::detail
