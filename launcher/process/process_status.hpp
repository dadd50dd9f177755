#pragma once
// What /proc says of another process of ours, for the checks ddprun makes before it signals a
// worker. Internal to the launcher.

#include <sys/types.h>

#include <set>

namespace ddp::launcher {

// True when process pid has a handler installed for `signal` now (/proc/<pid>/status,
// SigCgt): a signal whose action is the default one would kill it (or do nothing), and one a
// program replaced by exec no longer reaches the handler that asked for it. False when pid
// cannot be read (it exited).
bool catches_signal(pid_t pid, int signal);

// The threads of process pid that block `signal` now (/proc/<pid>/task/*/status, SigBlk).
std::set<pid_t> threads_blocking(pid_t pid, int signal);

// True once process pid has handled a `signal` sent to it: it is no longer pending for the
// process or any thread, and no thread other than `blocking_before` (threads_blocking before
// it was sent) blocks it (a handler runs with its signal blocked, unless it asked otherwise).
// True too when pid cannot be read (it exited).
bool handled_signal(pid_t pid, int signal, const std::set<pid_t>& blocking_before);

// True when descriptor fd of process pid is open on the same file as our descriptor `ours`
// (same device and inode): the worker still holds the file ddprun gave it under that number.
// False when it is closed, another file, or cannot be looked at.
bool holds_same_file(pid_t pid, int fd, int ours);

}  // namespace ddp::launcher
