"""A survivor that cannot leave the broken generation (ddprun --restart_policy=inplace): at step
5 rank 3 SIGKILLs itself, and rank 1 has issued a collective on a subgroup of ranks 0 and 1
(whose connections ddprun.inplace does not know, so their shutdown cannot end it) and waits.
ddprun must fall back to restarting every worker at once, saying why, rather than wait for
generation 1 until its limit. The restarted job (TORCHELASTIC_RESTART_COUNT > 0) runs its 8
steps and rank 0 prints `done`."""

import os
import signal
import time

import torch
import torch.distributed as dist

from ddprun import inplace

job = inplace.Job("gloo")
subgroup = dist.new_group([0, 1])  # every rank calls it
torch.manual_seed(0)
job.wrap(torch.nn.Linear(4, 2))
optimizer = torch.optim.SGD(job.module.parameters(), lr=0.1)
job.keep(optimizer=optimizer)
first_run = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
while job.step < 8:
    with job.attempt():
        if first_run and job.step == 5 and job.generation == 0:
            if job.rank == 3:
                os.kill(os.getpid(), signal.SIGKILL)
            if job.rank == 1:
                work = dist.all_reduce(torch.ones(1), group=subgroup, async_op=True)
                time.sleep(600)  # rank 0 never joins it: it recovers
        optimizer.zero_grad()
        job.model(torch.ones(3, 4)).sum().backward()
        optimizer.step()
        job.commit()
if job.rank == 0:
    print("done", flush=True)
