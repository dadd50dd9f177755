// What ddprun reads of a worker before it sends the stack signal: whether the process catches
// that signal now, and whether a descriptor of it is still ddprun's file. Checked on a forked
// child that sets itself up, says so on a pipe, and waits to be killed.
#include "process/process_status.hpp"

#include <poll.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <csignal>
#include <set>

using namespace ddp::launcher;

namespace {

void on_signal(int) {}

// A child that catches `caught` (0: none), then reports ready and sleeps until killed.
class Child {
 public:
  explicit Child(int caught) {
    int ends[2];
    REQUIRE(::pipe(ends) == 0);
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      if (caught != 0) ::signal(caught, on_signal);
      const char ready = 'r';
      if (::write(ends[1], &ready, 1) != 1) ::_exit(1);
      for (;;) ::pause();
    }
    ::close(ends[1]);
    pollfd ready{ends[0], POLLIN, 0};
    REQUIRE(::poll(&ready, 1, 10000) == 1);
    ::close(ends[0]);
  }
  ~Child() {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
};

}  // namespace

TEST_CASE("process status: catches_signal reads the handlers a process has now") {
  const int stack_signal = SIGRTMIN + 6;
  {
    Child child(stack_signal);
    CHECK(catches_signal(child.pid(), stack_signal));
    CHECK_FALSE(catches_signal(child.pid(), stack_signal + 1));
  }
  {
    Child child(0);  // the default action: the signal would kill it
    CHECK_FALSE(catches_signal(child.pid(), stack_signal));
  }
  pid_t gone = 0;
  {
    Child child(stack_signal);
    gone = child.pid();
  }
  CHECK_FALSE(catches_signal(gone, stack_signal));  // reaped: no such process
}

TEST_CASE("process status: holds_same_file tells ddprun's file from another at that number") {
  const int file = ::memfd_create("ddprun-python-stacks", 0);  // inherited by the child
  const int other = ::memfd_create("checkpoint", 0);
  REQUIRE(file >= 0);
  REQUIRE(other >= 0);
  {
    Child child(0);
    CHECK(holds_same_file(child.pid(), file, file));
    CHECK_FALSE(holds_same_file(child.pid(), other, file));
    CHECK_FALSE(holds_same_file(child.pid(), 999, file));  // not open
    CHECK_FALSE(holds_same_file(child.pid(), -1, file));
  }
  ::close(file);
  ::close(other);
}

namespace {

int g_entered = -1;  // in the forked child: the handler says it runs here...
int g_release = -1;  // ...and waits for a byte here before it returns

void waiting_handler(int) {
  const char in = 'i';
  [[maybe_unused]] ssize_t n = ::write(g_entered, &in, 1);
  char go;
  n = ::read(g_release, &go, 1);
}

bool readable(int fd, int timeout_ms) {
  pollfd ready{fd, POLLIN, 0};
  return ::poll(&ready, 1, timeout_ms) == 1;
}

}  // namespace

TEST_CASE("process status: handled_signal is false while the signal is pending or handled") {
  const int stack_signal = SIGRTMIN + 6;
  int entered[2], release[2], ready[2];
  REQUIRE(::pipe(entered) == 0);
  REQUIRE(::pipe(release) == 0);
  REQUIRE(::pipe(ready) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    g_entered = entered[1];
    g_release = release[0];
    struct sigaction action {};
    action.sa_handler = waiting_handler;  // no SA_NODEFER: blocked while it runs
    ::sigaction(stack_signal, &action, nullptr);
    sigset_t blocked;
    ::sigemptyset(&blocked);
    ::sigaddset(&blocked, stack_signal);
    ::sigprocmask(SIG_BLOCK, &blocked, nullptr);  // pending until the parent says
    const char r = 'r';
    if (::write(ready[1], &r, 1) != 1) ::_exit(1);
    char go;
    if (::read(release[0], &go, 1) != 1) ::_exit(1);
    ::sigprocmask(SIG_UNBLOCK, &blocked, nullptr);  // the handler runs here
    for (;;) ::pause();
  }
  REQUIRE(readable(ready[0], 10000));
  // Blocked by its only thread before the signal: that thread is not "in the handler".
  const std::set<pid_t> before = threads_blocking(pid, stack_signal);
  CHECK(before.contains(pid));
  REQUIRE(::kill(pid, stack_signal) == 0);
  CHECK_FALSE(handled_signal(pid, stack_signal, {}));  // pending
  CHECK_FALSE(handled_signal(pid, stack_signal, before));
  const char go = 'g';
  REQUIRE(::write(release[1], &go, 1) == 1);  // unblocks: the handler runs and waits
  REQUIRE(readable(entered[0], 10000));
  CHECK_FALSE(handled_signal(pid, stack_signal, {}));  // in the handler: blocked by it
  REQUIRE(::write(release[1], &go, 1) == 1);           // the handler returns
  // Event-driven: poll /proc until the handler's mask is undone, at most 10 s.
  bool handled = false;
  for (int i = 0; i < 10000 && !handled; ++i) {
    handled = handled_signal(pid, stack_signal, {});
    if (!handled) ::poll(nullptr, 0, 1);
  }
  CHECK(handled);
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  CHECK(handled_signal(pid, stack_signal, {}));  // gone
  for (int fd : {entered[0], entered[1], release[0], release[1], ready[0], ready[1]}) ::close(fd);
}
