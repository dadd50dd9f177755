"""Rank 1 calls its 3rd all_reduce with 3 elements where rank 0 passes 4 (a desync); used by
tests/launcher/agent/pytorch_diagnosis_test.cpp."""
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
for call in range(1, 4):
    n = 3 if rank == 1 and call == 3 else 4
    dist.all_reduce(torch.ones(n))
print(f"done rank {rank}", flush=True)
