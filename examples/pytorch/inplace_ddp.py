"""A DDP job that recovers in place under `ddprun --restart_policy=inplace` (docs/inplace.md).

    ddprun --nproc_per_node=4 --restart_policy=inplace --max_restarts=3 \
        examples/pytorch/inplace_ddp.py --steps 200

Each rank's data is a function of (step, rank), so a run's final parameters do not depend on
where it was interrupted: rank 0 prints `params <sha256 of the final parameters' bytes>` last.
Under torchrun, or another --restart_policy, the same program runs as plain DDP (with
--checkpoint, a restarted job goes on from the last checkpoint).

For tests and benchmarks:
  --step_seconds S           a pause in each step (so that a rank can be killed mid-run)
  --kill RANKS:STEP:WHERE[/RANKS:STEP:WHERE...]
                             each of RANKS (comma-separated) SIGKILLs itself at STEP (when its
                             process ran an earlier step; never after a restart of the whole
                             job), WHERE being `between` (before the step), `stop` (SIGSTOP, a
                             hang, before the step), `allreduce` (during backward, with some
                             gradient buckets reduced) or `optimizer` (inside optimizer.step(),
                             half the parameters updated)
  --replacement_fails        a replacement exits at start-up (an import that fails)
  --checkpoint PATH          rank 0 saves the state every --checkpoint_every steps; a job that
                             starts again loads it (for --restart_policy=all)
Each rank prints `started <rank> <pid> <generation>` first; a survivor prints `lost <rank> <unix
time>` when it recovered (the time its collective failed); every rank prints `resumed <rank>
<unix time>` after its first step following a recovery (or a restart); the rank that kills
itself prints `killing <rank> <unix time>` first.
"""

import argparse
import hashlib
import os
import signal
import time

import torch

from ddprun import inplace


def parse():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--step_seconds", type=float, default=0.0)
    parser.add_argument("--kill", default="")
    parser.add_argument("--checkpoint", default="")
    parser.add_argument("--checkpoint_every", type=int, default=20)
    parser.add_argument("--replacement_fails", action="store_true")
    parser.add_argument("--backend", default="gloo")
    return parser.parse_args()


def say(line):
    os.write(1, (line + "\n").encode())  # one write: ranks' lines never mix


def batch(step, rank):
    generator = torch.Generator().manual_seed(step * 1000 + rank)
    return torch.randn(32, 64, generator=generator), torch.randn(32, 8, generator=generator)


class Optimizer(torch.optim.SGD):
    """SGD that can die half-way through its step (--kill R:S:optimizer)."""

    die_in_step = False

    def step(self, closure=None):
        if not self.die_in_step:
            return super().step(closure)
        groups = self.param_groups
        self.param_groups = groups[:1]  # the first layer's parameters are updated, then death
        super().step(closure)
        self.param_groups = groups
        die()


def die():
    say(f"killing {os.environ['RANK']} {time.time():.6f}")
    os.kill(os.getpid(), signal.SIGKILL)


def main():
    args = parse()
    generation = inplace.generation_from_environment()
    say(f"started {os.environ['RANK']} {os.getpid()} {generation}")
    if args.replacement_fails and generation:
        raise ImportError("a module this replacement needs cannot be imported")
    torch.manual_seed(0)
    job = inplace.Job(args.backend)
    rank = job.rank
    net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    job.wrap(net)
    optimizer = Optimizer([{"params": net[0].parameters()}, {"params": net[2].parameters()}],
                          lr=0.01, momentum=0.9)
    job.keep(optimizer=optimizer)

    kills = {}  # step -> where, for this rank
    if args.kill and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
        for spec in args.kill.split("/"):
            ranks, step, where = spec.split(":")
            if rank in [int(r) for r in ranks.split(",")]:
                kills[int(step)] = where
    first_step = None  # the first step this process runs
    dying = {"in": ""}  # where this step's death comes, if it comes

    if args.checkpoint and os.path.exists(args.checkpoint):
        saved = torch.load(args.checkpoint)
        net.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        job.step = saved["step"]
    def in_backward(grad):
        if dying["in"] == "allreduce":
            die()
        return grad
    net[0].weight.register_hook(in_backward)  # the last gradient: later buckets are reduced

    resumed = job.generation not in (None, 0) or os.environ.get("TORCHELASTIC_RESTART_COUNT",
                                                                 "0") != "0"
    recoveries = job.recoveries
    while job.step < args.steps:
        with job.attempt():
            step = job.step
            first_step = step if first_step is None else first_step
            dying["in"] = kills.get(step, "") if first_step < step else ""
            if dying["in"] == "between":
                die()
            if dying["in"] == "stop":
                # A hang between steps: the diagnosis names this rank. PyTorch 2.x notes a
                # collective's end from another thread, just after the wait returns: the pause
                # lets it note the last one before the whole process stops.
                time.sleep(0.5)
                say(f"stopping {rank} {time.time():.6f}")
                os.kill(os.getpid(), signal.SIGSTOP)
            inputs, targets = batch(step, rank)
            optimizer.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(job.model(inputs), targets)
            if args.step_seconds:
                time.sleep(args.step_seconds)
            loss.backward()
            optimizer.die_in_step = dying["in"] == "optimizer"
            optimizer.step()
            job.commit()
            if args.checkpoint and rank == 0 and job.step % args.checkpoint_every == 0:
                torch.save({"model": net.state_dict(), "optimizer": optimizer.state_dict(),
                            "step": job.step}, args.checkpoint + ".tmp")
                os.replace(args.checkpoint + ".tmp", args.checkpoint)
        if job.recoveries != recoveries:
            recoveries = job.recoveries
            say(f"lost {rank} {job.last_lost_time:.6f}")
            resumed = True
        elif resumed:
            say(f"resumed {rank} {time.time():.6f}")
            resumed = False

    if rank == 0:
        digest = hashlib.sha256()
        for tensor in net.state_dict().values():
            digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
        say(f"recoveries {job.recoveries}")
        say(f"params {digest.hexdigest()}")


if __name__ == "__main__":
    main()
