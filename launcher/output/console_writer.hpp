#pragma once
// Writes the agent's console output (teed worker lines, notices, the failure report) from a
// thread of its own, so that a console that stops reading (a pager not scrolled, Ctrl-S)
// never stalls the agent's event loop. The console fds are shared with the workers and the
// user's shell and stay blocking; the writer thread is the one that waits on them. Internal.
//
// Order: everything written goes out in the order write_line/write_notice were called, across
// fds too (one FIFO, one thread), so that `2>&1` shows what it showed with plain writes.
// Back-pressure, never loss: teed lines are always queued; once they hold max_queued_bytes or
// more, has_room() is false, and a tee stops reading its worker's pipe until the writer calls
// the resume it gave to when_room() (the queue fell to half the bound): the worker then waits
// for the console as it would writing to it directly. Notices are never held back.
// Errors: an fd whose write fails (EPIPE: SIGPIPE must be ignored; EBADF, EIO...) is given
// up: what is queued for it and later text for it are discarded.
//
// Threading: write_line, write_notice, has_room, when_room and flush may be called from any
// thread (the agent calls them from its loop thread); write_line and write_notice never block
// on the console. when_room's resume runs on the writer thread (post it to your loop).
// Lifetime: the fds must stay open until flush returns or the writer is destroyed; the
// destructor flushes, then ends the thread.

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace ddp::launcher {

class ConsoleWriter {
 public:
  // How many bytes of teed lines may wait for a console that does not read before the tees
  // stop reading their workers.
  static constexpr std::size_t kMaxQueuedBytes = 16 * 1024 * 1024;

  explicit ConsoleWriter(std::size_t max_queued_bytes = kMaxQueuedBytes);
  ~ConsoleWriter();
  ConsoleWriter(const ConsoleWriter&) = delete;
  ConsoleWriter& operator=(const ConsoleWriter&) = delete;

  // Queues whole lines of worker output for fd (never dropped; see has_room()).
  void write_line(int fd, std::string text);
  // Queues text for fd (notices, the failure report).
  void write_notice(int fd, std::string text);

  // False while queued teed lines hold max_queued_bytes or more.
  bool has_room() const;
  // When there is no room: keeps resume, to be called once the queued teed lines fell to half
  // the bound (on the writer thread), and returns true; when there is room, returns false and
  // drops resume.
  bool when_room(std::function<void()> resume);

  // Blocks until everything queued so far has been written (or discarded because its fd
  // failed). Deliberately no timeout: at the end of a job, waiting for the user's console is
  // what a plain write(2) to it would do (torchrun too); a broken fd ends the wait.
  void flush();

 private:
  struct Entry {
    int fd = -1;
    std::string text;
    bool teed = false;  // counts against the bound
  };

  void enqueue(Entry entry);
  void run();
  bool is_drained() const;             // with mutex_ held
  void write_out(const Entry& entry);  // on the writer thread, without the lock

  const std::size_t max_queued_bytes_;
  mutable std::mutex mutex_;
  std::condition_variable work_;     // the writer thread waits for entries or stop
  std::condition_variable drained_;  // flush waits for the queue to empty
  std::deque<Entry> queue_;
  std::size_t queued_teed_bytes_ = 0;
  std::vector<std::function<void()>> waiting_for_room_;
  bool writing_ = false;  // the writer thread holds an entry outside the queue
  bool stop_ = false;
  std::set<int> broken_fds_;  // touched by the writer thread only
  std::thread thread_;        // last: starts once the members above exist
};

}  // namespace ddp::launcher
