#pragma once
// One thread that runs submitted tasks in order. Used by libddp (the Gloo backend's
// communication thread) and by the rendezvous engine (one thread per kind of work, each with
// its own store client, so that a blocked WAIT on one never holds up another). Header-only:
// common/ is shared by both sides and is not a library.

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

namespace ddp::common {

class TaskQueue {
 public:
  // What the destructor does with tasks still queued.
  enum class AtStop {
    kRunQueued,   // runs them, then joins: every submitted task runs (libddp's collectives)
    kDropQueued,  // drops them, waits for the running one, joins (the engine: its tasks
                  // watch a cancel flag, and queued ones are moot once it stops)
  };

  explicit TaskQueue(AtStop at_stop = AtStop::kRunQueued)
      : at_stop_(at_stop), thread_([this] { run(); }) {}

  ~TaskQueue() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
      if (at_stop_ == AtStop::kDropQueued) tasks_.clear();
    }
    ready_.notify_one();
    thread_.join();
  }

  TaskQueue(const TaskQueue&) = delete;
  TaskQueue& operator=(const TaskQueue&) = delete;

  // Queues task; it runs after every task submitted before it. Thread-safe. A task must not
  // throw (it reports failures through its own state).
  void submit(std::function<void()> task) {
    {
      std::lock_guard lock(mutex_);
      tasks_.push_back(std::move(task));
    }
    ready_.notify_one();
  }

 private:
  void run() {
    std::unique_lock lock(mutex_);
    for (;;) {
      ready_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stopping, and drained (or dropped)
      auto task = std::move(tasks_.front());
      tasks_.pop_front();
      lock.unlock();
      task();
      lock.lock();
    }
  }

  const AtStop at_stop_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  std::thread thread_;  // last: starts after the members it uses exist
};

}  // namespace ddp::common
