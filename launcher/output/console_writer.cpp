#include "console_writer.hpp"

#include <unistd.h>

#include <cerrno>

#include "ddp/launcher/write_all.hpp"

namespace ddp::launcher {

namespace {

std::string dropped_notice(std::size_t lines, const std::string& log_files) {
  return "ddprun: dropped " + std::to_string(lines) +
         " teed console lines while the console was not reading; every one is in " + log_files +
         "\n";
}

}  // namespace

ConsoleWriter::ConsoleWriter(int notice_fd, std::size_t max_queued_bytes)
    : notice_fd_(notice_fd), max_queued_bytes_(max_queued_bytes), thread_([this] { run(); }) {}

void ConsoleWriter::set_log_files(std::string where) {
  std::lock_guard lock(mutex_);
  log_files_ = std::move(where);
}

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
    if (entry.droppable) {
      if (queued_droppable_bytes_ + entry.text.size() > max_queued_bytes_) {
        ++dropped_total_;
        ++dropped_unreported_;
        work_.notify_one();  // a line larger than the bound may be dropped on an empty queue
        return;
      }
      queued_droppable_bytes_ += entry.text.size();
    }
    queue_.push_back(std::move(entry));
  }
  work_.notify_one();
}

void ConsoleWriter::flush() {
  std::unique_lock lock(mutex_);
  drained_.wait(lock, [this] { return is_drained(); });
}

std::size_t ConsoleWriter::dropped_lines() const {
  std::lock_guard lock(mutex_);
  return dropped_total_;
}

void ConsoleWriter::run() {
  std::unique_lock lock(mutex_);
  for (;;) {
    work_.wait(lock, [this] { return stop_ || !queue_.empty() || dropped_unreported_ > 0; });
    Entry entry;
    if (!queue_.empty()) {
      entry = std::move(queue_.front());
      queue_.pop_front();
      if (entry.droppable) queued_droppable_bytes_ -= entry.text.size();
    } else if (dropped_unreported_ > 0) {  // drained after drops: say so, once
      entry = {notice_fd_, dropped_notice(dropped_unreported_, log_files_), false};
      dropped_unreported_ = 0;
    } else {
      return;  // stop_, with nothing left
    }
    writing_ = true;
    lock.unlock();
    write_out(entry);
    lock.lock();
    writing_ = false;
    if (is_drained()) drained_.notify_all();
  }
}

bool ConsoleWriter::is_drained() const {
  return queue_.empty() && !writing_ && dropped_unreported_ == 0;
}

void ConsoleWriter::write_out(const Entry& entry) {
  if (broken_fds_.contains(entry.fd)) return;
  if (!write_all(entry.fd, entry.text.data(), entry.text.size())) broken_fds_.insert(entry.fd);
}

}  // namespace ddp::launcher
