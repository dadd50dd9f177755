"""Healthy jobs that a probe which numbered every group's collectives in one sequence would
call hung or desynchronized. Used by tests/launcher/agent/pytorch_diagnosis_test.cpp.
    uneven_groups.py subgroup: rank 0 does one all_reduce on a group of its own, then is slow
        for SLOW_S seconds before the barrier every rank calls;
    uneven_groups.py recv: rank 1 waits in irecv().wait() while rank 0 is slow to send."""
import sys
import time

import torch
import torch.distributed as dist

SLOW_S = 8

dist.init_process_group("gloo")
rank = dist.get_rank()
solo = dist.new_group([0])
t = torch.ones(4)
if sys.argv[1] == "subgroup":
    if rank == 0:
        dist.all_reduce(t, group=solo)
        time.sleep(SLOW_S)  # busy with its own work
    dist.barrier()
else:
    if rank == 0:
        time.sleep(SLOW_S)
        dist.send(t, 1)
    elif rank == 1:
        dist.irecv(t, 0).wait()
dist.all_reduce(t)
print("done rank %d" % rank, flush=True)
dist.destroy_process_group()
