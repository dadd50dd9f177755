"""A PyTorch gloo job that fails once and then succeeds on the agent's store: in attempt 0,
rank 1 exits with status 3 after a first all_reduce; attempt 1 must meet again through the
same store (keys under /worker/attempt_1, not confused by attempt 0's) and print
"attempt=A rank=R sum=S"."""
import os
import sys

import torch
import torch.distributed as dist

attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
assert os.environ["TORCHELASTIC_USE_AGENT_STORE"] == "True"
dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
if attempt == 0 and rank == 1:
    sys.exit(3)
if attempt == 0:
    dist.barrier()  # rank 1 is gone: the agent stops this rank, then restarts the group
sys.stdout.write(f"attempt={attempt} rank={rank} sum={t.item():g}\n")
sys.stdout.flush()
dist.destroy_process_group()
