#pragma once
// A WorkState completed by whoever runs the operation (the Gloo communication thread).

#include <condition_variable>
#include <exception>
#include <mutex>

#include "ddp/work.hpp"

namespace ddp::detail {

class PromiseWork : public WorkState {
 public:
  explicit PromiseWork(std::string description) : description_(std::move(description)) {}

  // Marks the operation finished, with its failure if error is set. Wakes every waiter. The
  // first completion wins (an abort may fail a Work before its operation ends); returns
  // whether this call completed it.
  bool complete(std::exception_ptr error = nullptr);

  bool wait_for(std::chrono::milliseconds timeout) override;
  bool done() override;
  std::string describe() const override { return description_; }

 private:
  std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::exception_ptr error_;
  const std::string description_;
};

}  // namespace ddp::detail
