"""Rank 0 raises while rank 1 sleeps outside any collective, with a SIGTERM handler that
saves a checkpoint (prints a line) and exits: under torchrun that handler runs, and it must
under ddprun. Used by tests/launcher/agent/pytorch_diagnosis_test.cpp."""
import signal
import sys
import time

import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()


def save_and_exit(signum, frame):
    print(f"rank {rank}: SIGTERM handler ran: checkpoint saved", flush=True)
    sys.exit(0)


signal.signal(signal.SIGTERM, save_and_exit)
dist.barrier()
if rank == 0:
    raise RuntimeError("rank 0 fails on purpose")
time.sleep(120)
