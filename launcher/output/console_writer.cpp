#include "output/console_writer.hpp"

#include <unistd.h>

#include <cerrno>

#include "ddp/launcher/write_all.hpp"

namespace ddp::launcher {

ConsoleWriter::ConsoleWriter(std::size_t max_queued_bytes)
    : max_queued_bytes_(max_queued_bytes), thread_([this] { run(); }) {}

ConsoleWriter::~ConsoleWriter() {
  flush();
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  work_.notify_one();
  thread_.join();
}

void ConsoleWriter::write_line(int fd, std::string text) { enqueue({fd, std::move(text), true}); }

void ConsoleWriter::write_notice(int fd, std::string text) {
  enqueue({fd, std::move(text), false});
}

void ConsoleWriter::enqueue(Entry entry) {
  if (entry.text.empty()) return;
  {
    std::lock_guard lock(mutex_);
    if (entry.teed) queued_teed_bytes_ += entry.text.size();
    queue_.push_back(std::move(entry));
  }
  work_.notify_one();
}

bool ConsoleWriter::has_room() const {
  std::lock_guard lock(mutex_);
  return queued_teed_bytes_ < max_queued_bytes_;
}

bool ConsoleWriter::when_room(std::function<void()> resume) {
  std::lock_guard lock(mutex_);
  if (queued_teed_bytes_ < max_queued_bytes_) return false;
  waiting_for_room_.push_back(std::move(resume));
  return true;
}

void ConsoleWriter::flush() {
  std::unique_lock lock(mutex_);
  drained_.wait(lock, [this] { return is_drained(); });
}

void ConsoleWriter::run() {
  std::unique_lock lock(mutex_);
  for (;;) {
    work_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_, with nothing left
    Entry entry = std::move(queue_.front());
    queue_.pop_front();
    std::vector<std::function<void()>> resumes;
    if (entry.teed) {
      queued_teed_bytes_ -= entry.text.size();
      if (queued_teed_bytes_ <= max_queued_bytes_ / 2) resumes.swap(waiting_for_room_);
    }
    writing_ = true;
    lock.unlock();
    for (auto& resume : resumes) resume();
    write_out(entry);
    lock.lock();
    writing_ = false;
    if (is_drained()) drained_.notify_all();
  }
}

bool ConsoleWriter::is_drained() const { return queue_.empty() && !writing_; }

void ConsoleWriter::write_out(const Entry& entry) {
  if (broken_fds_.contains(entry.fd)) return;
  if (!write_all(entry.fd, entry.text.data(), entry.text.size())) broken_fds_.insert(entry.fd);
}

}  // namespace ddp::launcher
