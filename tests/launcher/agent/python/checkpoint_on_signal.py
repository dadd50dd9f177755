"""A worker that writes a checkpoint from its SIGTERM or SIGINT handler, as a preempted training
job does: 20 chunks, 50 ms apart, then "checkpoint done" and exit 0. SIGUSR1 (Slurm's warning
before the end, --signal=USR1@N) is only noted; the job goes on. Plain Python.

usage: checkpoint_on_signal.py OUT_DIR   (writes OUT_DIR/checkpoint-<rank>)"""
import os
import signal
import sys
import time

rank = os.environ["RANK"]
path = os.path.join(sys.argv[1], "checkpoint-" + rank)


def say(line):
    os.write(1, (line + "\n").encode())  # one write: the two ranks' lines never interleave


def checkpoint(signum, frame):
    say(f"checkpoint started rank={rank} on {signal.Signals(signum).name}")
    with open(path, "w") as out:
        for chunk in range(20):
            out.write(f"chunk {chunk}\n")
            out.flush()
            time.sleep(0.05)
    say(f"checkpoint done rank={rank}")
    sys.exit(0)


def warning(signum, frame):
    say(f"warning noted rank={rank}")


signal.signal(signal.SIGTERM, checkpoint)
signal.signal(signal.SIGINT, checkpoint)
signal.signal(signal.SIGUSR1, warning)
say(f"training rank={rank}")
while True:
    time.sleep(0.05)
