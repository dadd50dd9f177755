"""A PyTorch NCCL job of any world size: STEPS steps of all_to_all_single (a send and a recv
to every rank, itself included) and an all_reduce; prints the time per step. Used by
scripts/gpu-plugin-check on a GPU machine (one GPU: a world of one, every all_to_all a send to
itself, which NCCL gives no proxy work):
    ddprun --standalone --nproc_per_node=1 nccl_all_to_all.py [--steps N] [--elements N]"""
import argparse
import os
import time

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=5000)
parser.add_argument("--elements", type=int, default=1024)
parser.add_argument("--idle-seconds", type=float, default=0,
                    help="idle this long at the end: a record left unfinished would then read "
                    "as a hang past ddprun's --hang_timeout")
args = parser.parse_args()

local_rank = int(os.environ.get("LOCAL_RANK", "0"))
torch.cuda.set_device(local_rank)
dist.init_process_group("nccl")
world = dist.get_world_size()
sent = torch.ones(args.elements * world, device="cuda")
received = torch.empty_like(sent)
total = torch.ones(1, device="cuda")
for step in range(args.steps + 100):
    if step == 100:  # after the warm-up
        torch.cuda.synchronize()
        start = time.perf_counter()
    dist.all_to_all_single(received, sent)
    dist.all_reduce(total)
torch.cuda.synchronize()
seconds = time.perf_counter() - start
print("rank %d: %d steps, %.1f us a step (all_to_all_single of %d floats + all_reduce)"
      % (dist.get_rank(), args.steps, seconds / args.steps * 1e6, args.elements * world),
      flush=True)
time.sleep(args.idle_seconds)  # the workload idles: no collective in flight
dist.destroy_process_group()
