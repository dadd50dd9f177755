"""A small PyTorch DDP job (Gloo, CPU) for ddprun's PyTorch diagnosis tests
(tests/launcher/agent/pytorch_diagnosis_test.cpp), with one misbehaving rank on request:
  --steps N                 steps of every rank (default 8)
  --stuck-rank R --stuck-step S --stuck-seconds T
                            rank R spends T s in its data loader before step S
  --fewer-batches R:K       rank R has only K batches, then enters barrier() (uneven inputs)
  --step-seconds T          every rank's loader takes T s a batch (default 0)
Prints "step <k> rank <r>" after each step and "done rank <r>" at the end."""
import argparse
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=8)
parser.add_argument("--stuck-rank", type=int, default=-1)
parser.add_argument("--stuck-step", type=int, default=5)
parser.add_argument("--stuck-seconds", type=float, default=3600)
parser.add_argument("--fewer-batches", default="")
parser.add_argument("--step-seconds", type=float, default=0)
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Linear(16, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

steps = args.steps
if args.fewer_batches:
    short_rank, batches = (int(x) for x in args.fewer_batches.split(":"))
    if rank == short_rank:
        steps = batches


def load_batch(step):
    time.sleep(args.step_seconds)
    if rank == args.stuck_rank and step == args.stuck_step:
        time.sleep(args.stuck_seconds)  # the stuck loader: its stack must show this line
    return torch.randn(8, 16), torch.randn(8, 4)


for step in range(1, steps + 1):
    x, y = load_batch(step)
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    print(f"step {step} rank {rank}", flush=True)
dist.barrier()
print(f"done rank {rank}", flush=True)
