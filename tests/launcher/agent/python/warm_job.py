"""A 2-rank Gloo job for warm_start_test.cpp: warm_job.py MODE OUT.

Every mode imports the program's own warm_own_module (counted in WARM_MARKER) and does an
all_reduce. Then, in attempt 0 (TORCHELASTIC_RESTART_COUNT=0):
- raise: rank 1 raises ValueError (the job fails);
- wait: prints "ready <pid>" and waits until OUT/go exists (the test kills ddprun meanwhile);
- thread, changed, killed: imports an installed module (warm_thready or warm_plain, from the
  folder the test put on PYTHONPATH); rank 1 then (changed) rewrites warm_plain.py, or (killed)
  kills ddprun's warm template, and exits with code 3. Attempt 1 prints "attempt 1 rank R" and
  exits 0.
"""

import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import warm_own_module  # noqa: F401


_KEEP = []


def template_pid():
    """The pid of ddprun's warm template (the child of our ddprun running _ddprun_template.py)."""
    agent = os.getppid()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % name, "rb") as f:
                cmdline = f.read()
            with open("/proc/%s/stat" % name) as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
        if b"_ddprun_template.py" in cmdline and parent == agent:
            return int(name)
    return None


def wait_for_template(text="prepared:"):
    """Until ddprun's warm template has imported what this attempt's lists named (its log,
    <log root>/warm_template.log, says so: `text` is in it), at most 60 s."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.environ["TORCHELASTIC_ERROR_FILE"])))
    log = os.path.join(root, "warm_template.log")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with open(log) as f:
                if text in f.read():
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError("ddprun's warm template did not prepare within 60 s")


def main():
    mode, out = sys.argv[1], sys.argv[2]
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    if mode == "thread":
        import warm_thready  # noqa: F401
    elif mode in ("changed", "killed"):
        import warm_plain  # noqa: F401
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    # Kept until exit: a tensor whose last reference a Gloo thread drops while Python finalizes
    # aborts PyTorch 1.13 on Python 3.11 ("terminate called without an active exception"),
    # exec'd or forked alike, in about 1 run in 40.
    _KEEP.append(torch.ones(2))
    dist.all_reduce(_KEEP[-1])
    if attempt > 0:
        sys.stdout.write("attempt %d rank %d\n" % (attempt, rank))  # one write: ranks interleave
        sys.stdout.flush()
        return
    if mode == "raise" and rank == 1:
        raise ValueError("boom from rank 1")
    if mode == "wait":
        sys.stdout.write("ready %d\n" % os.getpid())  # one write: ranks interleave
        sys.stdout.flush()
        while not os.path.exists(os.path.join(out, "go")):
            time.sleep(0.05)
        return
    dist.barrier()
    if mode in ("thread", "changed", "killed") and rank == 1:
        if mode in ("changed", "killed"):
            wait_for_template()
        if mode == "changed":
            path = sys.modules["warm_plain"].__file__
            with open(path, "a") as f:
                f.write("VERSION = 2\n")
        if mode == "killed":
            os.kill(template_pid(), signal.SIGKILL)
        sys.exit(3)


if __name__ == "__main__":
    main()
