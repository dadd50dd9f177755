"""Two or more ranks under ddprun: init_process_group("gloo") through env://, all_reduce of
rank+1, barrier. Prints "allreduce rank=R world=W sum=S".

With the argument fail_first: in attempt 0 (TORCHELASTIC_RESTART_COUNT=0) the last rank exits
with status 3 after the all_reduce, once every rank's Gloo addresses are in the store; the
lines end with " attempt=N"."""
import os
import sys

import torch
import torch.distributed as dist

fail_first = sys.argv[1:] == ["fail_first"]
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
if fail_first and attempt == 0 and rank == world - 1:
    sys.exit(3)
dist.barrier()
suffix = f" attempt={attempt}" if fail_first else ""
sys.stdout.write(f"allreduce rank={rank} world={world} sum={t.item():g}{suffix}\n")  # one write
sys.stdout.flush()
dist.destroy_process_group()
