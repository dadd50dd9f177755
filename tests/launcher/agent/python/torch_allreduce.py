"""Two or more ranks under ddprun: init_process_group("gloo") through env://, all_reduce of
rank+1, barrier. Prints "allreduce rank=R world=W sum=S"."""
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
dist.barrier()
sys.stdout.write(f"allreduce rank={rank} world={world} sum={t.item():g}\n")  # one write per line
sys.stdout.flush()
dist.destroy_process_group()
