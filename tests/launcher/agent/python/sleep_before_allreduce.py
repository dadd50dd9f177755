"""Rank 1 sleeps before an all_reduce that rank 0 waits in; the process group's short timeout
makes rank 0 fail. Used by tests/launcher/agent/hang_test.cpp: ddprun's stop must show where
rank 1 was (its Python stack, at the sleep)."""
import datetime
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=3))
if dist.get_rank() == 1:
    time.sleep(120)  # rank 1's stack must show this line
dist.all_reduce(torch.ones(4))
