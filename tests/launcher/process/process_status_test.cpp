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
