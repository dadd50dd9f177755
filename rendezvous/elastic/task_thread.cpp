#include "task_thread.hpp"

namespace ddp::elastic {

TaskThread::TaskThread() : thread_([this] { run(); }) {}

TaskThread::~TaskThread() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    tasks_.clear();
  }
  ready_.notify_all();
  thread_.join();
}

void TaskThread::post(std::function<void()> task) {
  {
    std::lock_guard lock(mutex_);
    tasks_.push_back(std::move(task));
  }
  ready_.notify_all();
}

void TaskThread::run() {
  std::unique_lock lock(mutex_);
  while (true) {
    ready_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
    if (stopping_) return;
    auto task = std::move(tasks_.front());
    tasks_.pop_front();
    lock.unlock();
    task();
    lock.lock();
  }
}

}  // namespace ddp::elastic
