#pragma once
// Writes the agent's console output (teed worker lines, notices, the failure report) from a
// thread of its own, so that a console that stops reading (a pager not scrolled, Ctrl-S)
// never stalls the agent's event loop. The console fds are shared with the workers and the
// user's shell and stay blocking; the writer thread is the one that waits on them. Internal.
//
// Order: everything written goes out in the order write_line/write_notice were called, across
// fds too (one FIFO, one thread), so that `2>&1` shows what it showed with plain writes.
// Bound: queued teed lines hold at most max_queued_bytes; a teed line that would exceed it is
// dropped and counted (only teed lines are queued here, and --tee writes every one to a log
// file). Notices are never dropped. When the queue has drained after drops, the writer adds
// one line to notice_fd saying how many, and where the log files are (set_log_files).
// Errors: an fd whose write fails (EPIPE: SIGPIPE must be ignored; EBADF, EIO...) is given
// up: what is queued for it and later text for it are discarded.
//
// Threading: write_line, write_notice, dropped_lines and flush may be called from any thread
// (the agent calls them from its loop thread); write_line and write_notice never block on the
// console. Lifetime: the fds must stay open until flush returns or the writer is destroyed;
// the destructor flushes, then ends the thread.

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>
#include <set>
#include <string>
#include <thread>

namespace ddp::launcher {

class ConsoleWriter {
 public:
  // The most bytes of teed lines waiting for a console that does not read.
  static constexpr std::size_t kMaxQueuedBytes = 16 * 1024 * 1024;

  explicit ConsoleWriter(int notice_fd, std::size_t max_queued_bytes = kMaxQueuedBytes);
  ~ConsoleWriter();
  ConsoleWriter(const ConsoleWriter&) = delete;
  ConsoleWriter& operator=(const ConsoleWriter&) = delete;

  // Queues whole lines of worker output for fd; dropped (and counted) past the bound.
  void write_line(int fd, std::string text);
  // Queues text for fd that is never dropped (notices, the failure report).
  void write_notice(int fd, std::string text);

  // Blocks until everything queued so far has been written (or discarded because its fd
  // failed). Deliberately no timeout: at the end of a job, waiting for the user's console is
  // what a plain write(2) to it would do (torchrun too); a broken fd ends the wait.
  void flush();

  // Teed lines dropped so far.
  std::size_t dropped_lines() const;

  // Where the teed lines' log files are, for the line about dropped ones ("<dir>/attempt_<n>/
  // <local_rank>/stdout.log and stderr.log").
  void set_log_files(std::string where);

 private:
  struct Entry {
    int fd = -1;
    std::string text;
    bool droppable = false;
  };

  void enqueue(Entry entry);
  void run();
  bool is_drained() const;             // with mutex_ held
  void write_out(const Entry& entry);  // on the writer thread, without the lock

  const int notice_fd_;
  const std::size_t max_queued_bytes_;
  mutable std::mutex mutex_;
  std::condition_variable work_;     // the writer thread waits for entries or stop
  std::condition_variable drained_;  // flush waits for the queue to empty
  std::deque<Entry> queue_;
  std::size_t queued_droppable_bytes_ = 0;
  std::size_t dropped_total_ = 0;
  std::size_t dropped_unreported_ = 0;
  std::string log_files_ = "the workers' log files";
  bool writing_ = false;  // the writer thread holds an entry outside the queue
  bool stop_ = false;
  std::set<int> broken_fds_;  // touched by the writer thread only
  std::thread thread_;        // last: starts once the members above exist
};

}  // namespace ddp::launcher
