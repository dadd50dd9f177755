"""A 2-rank job of plain Python (no PyTorch) for warm_loop_test.cpp: warm_wait.py OUT.

Attempt 0: each rank imports warm_slow (installed: the test puts its site folder on PYTHONPATH,
and names it in --warm_preload, so that the warm template's import of it never ends). Rank 1
starts a child in a session of its own (ddprun's stop leaves it) that holds its
stdout and prints "tick while the template imports" once the template is importing; and exits
with code 3. Rank 0 waits to be stopped. Attempt 1 prints "attempt 1 rank R" and exits 0.
"""

import os
import subprocess
import sys
import time

import warm_slow  # noqa: F401

_TICK = """
import os, sys, time
out = sys.argv[1]
deadline = time.monotonic() + 120
while not os.path.exists(os.path.join(out, "importing")) and time.monotonic() < deadline:
    time.sleep(0.05)
print("tick while the template imports", flush=True)
"""


def main():
    out = sys.argv[1]
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    rank = int(os.environ["RANK"])
    if attempt > 0:
        sys.stdout.write("attempt %d rank %d\n" % (attempt, rank))
        sys.stdout.flush()
        return 0
    if rank == 0:
        while True:
            time.sleep(1)
    subprocess.Popen([sys.executable, "-c", _TICK, out], start_new_session=True)
    return 3


if __name__ == "__main__":
    sys.exit(main())
