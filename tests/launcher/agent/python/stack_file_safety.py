"""A Python worker that does, before ddprun's `kill -USR1` takes its stack, what a program may
do to the descriptors and signals ddprun's probe set up; then it waits for <folder>/go and
exits 0. Used by tests/launcher/agent/python_probe_safety_test.cpp (no torch).

    stack_file_safety.py <mode> <folder>

Modes (what rank 0 / rank 1 do):
- handler: rank 0 re-execs Python on itself (a wrapper: the new image has no probe, and the
  probe's stack signal's handler is gone); rank 1 sets the signal back to its default action.
  A stack signal sent now would kill either.
- reuse: rank 0 closes descriptors 3..63 and opens files until one gets the number ddprun gave
  the stack file (DDPRUN_STACK_FD): its checkpoint, <folder>/checkpoint0; rank 1 puts its
  checkpoint, <folder>/checkpoint1, on the very descriptor the probe writes stacks into. A
  stack dump must not land in either checkpoint.
- plain: nothing (the probe's stack signal works).
Prints "ready rank R" once set up, and "done rank R" at the end."""

import os
import signal
import sys
import time

CHECKPOINT_TEXT = "checkpoint\n"
STACK_FILE = "/memfd:ddprun-python-stacks"


def stack_file_descriptors():
    """This process's descriptors on ddprun's stack file."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink("/proc/self/fd/" + name).startswith(STACK_FILE):
                found.append(int(name))
        except OSError:
            pass
    return found


def open_checkpoint(folder, rank):
    return os.open(os.path.join(folder, "checkpoint%d" % rank), os.O_WRONLY | os.O_CREAT, 0o644)


def reuse(folder, rank):
    if rank == 0:
        wanted = int(os.environ["DDPRUN_STACK_FD"])
        os.closerange(3, 64)
        spare = []
        fd = open_checkpoint(folder, rank)
        while fd < wanted:  # the lowest free numbers first, as any program's next opens
            spare.append(fd)
            fd = open_checkpoint(folder, rank)
        assert fd == wanted, (fd, wanted)
    else:
        fd = open_checkpoint(folder, rank)
        for registered in stack_file_descriptors():
            os.dup2(fd, registered)
    os.write(fd, CHECKPOINT_TEXT.encode())


def say(line):
    """One line in one write: the ranks share ddprun's stdout."""
    os.write(1, (line + "\n").encode())


def wait_for_go(folder, rank):
    say("ready rank %d" % rank)
    deadline = time.monotonic() + 120
    go = os.path.join(folder, "go")
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.02)  # the stack signal arrives here; PEP 475 resumes the sleep
    say("done rank %d" % rank)


def main(mode, folder, execd=False):
    rank = int(os.environ["RANK"])
    if mode == "handler" and not execd:
        if rank == 0:
            os.execv(sys.executable, [sys.executable, __file__, mode, folder, "--execd"])
        signal.signal(int(os.environ["DDPRUN_STACK_SIGNAL"]), signal.SIG_DFL)
    if mode == "reuse":
        reuse(folder, rank)
    wait_for_go(folder, rank)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:] == ["--execd"])
