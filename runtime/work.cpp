#include "ddp/work.hpp"

#include "promise_work.hpp"

namespace ddp {

namespace detail {

void WorkState::wait_on_stream(void* /*stream*/, std::chrono::milliseconds timeout) {
  if (!wait_for(timeout)) {
    throw CommError(describe() + " did not complete within " + std::to_string(timeout.count()) +
                    " ms");
  }
}

bool PromiseWork::complete(std::exception_ptr error) {
  {
    std::lock_guard lock(mutex_);
    if (done_) return false;
    done_ = true;
    error_ = std::move(error);
  }
  done_cv_.notify_all();
  return true;
}

bool PromiseWork::wait_for(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  if (!done_cv_.wait_for(lock, timeout, [this] { return done_; })) return false;
  if (error_) std::rethrow_exception(error_);
  return true;
}

bool PromiseWork::done() {
  std::lock_guard lock(mutex_);
  return done_;
}

}  // namespace detail

void Work::wait(std::chrono::milliseconds timeout) const {
  if (!state_) return;
  if (!state_->wait_for(timeout)) {
    throw CommError(state_->describe() + " did not complete within " +
                    std::to_string(timeout.count()) + " ms");
  }
}

bool Work::completed() const { return !state_ || state_->done(); }

void Work::wait_on_stream(void* stream, std::chrono::milliseconds timeout) const {
  if (state_) state_->wait_on_stream(stream, timeout);
}

}  // namespace ddp
