"""Writes a stand-in Flight Recorder dump where ddprun told PyTorch to (TORCH_FR_DUMP_TEMP_FILE
+ rank), as an NCCL process group that timed out would. Rank 0 fails once every rank's dump
is there; the others wait to be stopped. Used by tests/launcher/agent/hang_test.cpp with
fake_fr/ on PYTHONPATH as the analyser."""
import os
import sys
import time

prefix = os.environ["TORCH_FR_DUMP_TEMP_FILE"]
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
with open(f"{prefix}{rank}.tmp", "wb") as dump:
    dump.write(b"stand-in dump of rank %d" % rank)
os.rename(f"{prefix}{rank}.tmp", f"{prefix}{rank}")  # whole, as PyTorch writes it
if rank != 0:
    time.sleep(120)  # until ddprun stops it
deadline = time.monotonic() + 60
while not all(os.path.exists(f"{prefix}{r}") for r in range(world)):
    if time.monotonic() > deadline:
        sys.exit("the other ranks' dumps did not appear")
    time.sleep(0.01)
sys.exit(1)
