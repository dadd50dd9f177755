"""What one collective costs a PyTorch worker: N one-element all_reduce calls in a world of one
(Gloo), synchronous and async_op=True (then wait()), alternating, 4 rounds of each; prints the
best round's wall and CPU time per call. Run under ddprun (scripts/bench-probe does, with the
probe on and off):
    ddprun --standalone --nproc_per_node=1 scripts/probe_collective_cost.py [N]"""
import sys
import time

import torch
import torch.distributed as dist

calls = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
dist.init_process_group("gloo")
t = torch.ones(1)
best = {}
for mode in ("sync", "async") * 4:
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        if mode == "sync":
            dist.all_reduce(t)
        else:
            dist.all_reduce(t, async_op=True).wait()
    wall = (time.perf_counter() - wall) / calls * 1e6
    cpu = (time.process_time() - cpu) / calls * 1e6
    old = best.get(mode, (wall, cpu))
    best[mode] = (min(old[0], wall), min(old[1], cpu))
print("per call: sync %.1f us (cpu %.1f), async %.1f us (cpu %.1f)"
      % (best["sync"] + best["async"]))
dist.destroy_process_group()
