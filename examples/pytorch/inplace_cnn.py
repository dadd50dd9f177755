"""An ordinary DDP training program that recovers in place under `ddprun
--restart_policy=inplace` (docs/inplace.md): a small CNN with BatchNorm and Dropout, Adam with
an LR scheduler, gradient accumulation over two micro-batches, a DataLoader with a
DistributedSampler, a random stream of its own on each rank, and rank 0 logging.

    ddprun --standalone --nproc_per_node=4 --restart_policy=inplace --max_restarts=3 \
        examples/pytorch/inplace_cnn.py --steps 100

What makes it recover to the state of a run that never failed:
- the batches follow from job.step: the DataLoader is made again at each epoch with its
  sampler's epoch and its own generator seeded by the epoch (so that making it draws nothing
  from the rank's random stream), and a replacement skips to its step;
- the batches of a step are fetched inside the step, once: a step run again after a recovery
  uses the batches it fetched before;
- the scheduler is kept with the optimizer (job.keep); the model's buffers, the random streams
  and DDP's bucket layout are kept without asking.
Under torchrun, or another --restart_policy, it runs as plain DDP; with --checkpoint_dir a
restarted job goes on from its last checkpoint.

Each rank prints `started <rank> <pid> <generation>` first and `state <rank> <digests>` last:
its parameters, buffers, optimizer state, scheduler and random streams, for a test to compare
with an uninterrupted run. As examples/pytorch/inplace_ddp.py, a survivor prints `lost <rank>
<unix time>` when it recovered and every rank `resumed <rank> <unix time>` after its first step
that follows; rank 0 prints `trained <seconds>` (its training loop's time).

For tests and benchmarks:
  --step_seconds S           a pause in each step (so that a rank can be killed mid-run)
  --loader_workers N         the DataLoader's worker processes (0: none)
  --kill RANK:STEP:WHERE[/...]
                             RANK SIGKILLs itself in STEP (when its process ran an earlier
                             step; never after a restart of the whole job), WHERE being
                             `between` (before the step), `forward` (in the second forward,
                             after BatchNorm and Dropout), `backward` (during the all-reduce,
                             some buckets reduced), `optimizer` (inside optimizer.step(), after
                             the all-reduce, half the parameters updated), `end` (after its
                             last step, as the program ends) or `stop` (SIGSTOP: a hang before
                             the step's forward)
"""

import argparse
import hashlib
import os
import pickle
import signal
import time

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from ddprun import inplace


def parse():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--step_seconds", type=float, default=0.0)
    parser.add_argument("--loader_workers", type=int, default=0)
    parser.add_argument("--kill", default="")
    parser.add_argument("--checkpoint_dir", default=None)
    parser.add_argument("--checkpoint_every", type=int, default=10)
    parser.add_argument("--backend", default="gloo")
    return parser.parse_args()


def say(line):
    os.write(1, (line + "\n").encode())  # one write: ranks' lines never mix


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.drop = nn.Dropout(0.25)
        self.head = nn.Linear(8 * 7 * 7, 10)

    def forward(self, x):
        x = torch.relu(self.bn(self.conv(x)))
        x = self.drop(nn.functional.max_pool2d(x, 4))
        return self.head(x.flatten(1))


def dataset():
    generator = torch.Generator().manual_seed(1234)
    images = torch.randn(1024, 1, 28, 28, generator=generator)
    labels = torch.randint(0, 10, (1024,), generator=generator)
    return TensorDataset(images, labels)


class Batches:
    """The two micro-batches of each step, as a function of the step."""

    def __init__(self, data, rank, world_size, workers):
        self.sampler = DistributedSampler(data, num_replicas=world_size, rank=rank, seed=7)
        self.generator = torch.Generator()
        self.loader = DataLoader(data, batch_size=16, sampler=self.sampler,
                                 num_workers=workers, generator=self.generator,
                                 persistent_workers=False)
        self.per_epoch = len(self.loader) // 2
        self.iterator = None
        self.next_step = None  # the step the iterator's next two batches are for
        self.cached = (None, None)  # (step, its batches): a step run again uses them

    def get(self, step):
        if self.cached[0] == step:
            return self.cached[1]
        epoch, offset = divmod(step, self.per_epoch)
        if self.next_step != step or offset == 0:
            self.sampler.set_epoch(epoch)
            self.generator.manual_seed(100 + epoch)
            self.iterator = iter(self.loader)
            for _ in range(2 * offset):
                next(self.iterator)
        batches = (next(self.iterator), next(self.iterator))
        self.next_step = step + 1
        self.cached = (step, batches)
        return batches


class Adam(torch.optim.Adam):
    """Adam that can die inside its step, half the parameters updated (--kill R:S:optimizer)."""

    def __init__(self, params, dying, die, **options):
        super().__init__(params, **options)
        self._dying, self._die = dying, die

    def step(self, closure=None):
        if self._dying["in"] != "optimizer":
            return super().step(closure)
        with torch.no_grad():
            for group in self.param_groups:
                for p in group["params"][:2]:
                    p.add_(p.grad, alpha=-0.01)
        self._die()


def digest(values):
    hasher = hashlib.sha256()
    for value in values:
        if isinstance(value, torch.Tensor):
            hasher.update(value.detach().cpu().contiguous().numpy().tobytes())
        else:
            hasher.update(pickle.dumps(value))
    return hasher.hexdigest()[:16]


def tensors_of(state):
    """The tensors and numbers of an optimizer's state_dict, in a fixed order."""
    out = []
    for key in sorted(state["state"]):
        for name in sorted(state["state"][key]):
            out.append(state["state"][key][name])
    for group in state["param_groups"]:
        out.append(sorted((k, v) for k, v in group.items() if k != "params"))
    return out


def main():
    args = parse()
    generation = inplace.generation_from_environment()
    say(f"started {os.environ['RANK']} {os.getpid()} {generation}")
    torch.manual_seed(0)  # the same initial model on every rank
    net = Net()
    job = inplace.Job(args.backend, checkpoint_dir=args.checkpoint_dir,
                      every=args.checkpoint_every)
    rank = job.rank
    torch.manual_seed(1000 + rank)  # each rank's own stream (Dropout)
    kills = {}
    if args.kill and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
        for spec in args.kill.split("/"):
            who, step, where = spec.split(":")
            if int(who) == rank:
                kills[int(step)] = where
    first_step = None
    dying = {"in": ""}

    def die():
        say(f"killing {rank} {time.time():.6f}")
        os.kill(os.getpid(), signal.SIGKILL)

    job.wrap(net, bucket_cap_mb=0.005)  # small buckets: a death in the backward leaves some
    optimizer = Adam(net.parameters(), lr=0.01, dying=dying, die=die)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.5)
    job.keep(optimizer=optimizer, scheduler=scheduler)
    batches = Batches(dataset(), rank, job.world_size, args.loader_workers)

    def after_bn(module, inputs, output):
        if dying["in"] == "forward" and dying["micro"] == 1:
            die()

    def in_backward(grad):
        if dying["in"] == "backward":
            die()
        return grad

    net.bn.register_forward_hook(after_bn)
    net.conv.weight.register_hook(in_backward)  # the last gradient: later buckets are reduced
    resumed = job.generation not in (None, 0) or \
        os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0"
    recoveries = job.recoveries
    began = time.perf_counter()
    while job.step < args.steps:
        with job.attempt():
            step = job.step
            first_step = step if first_step is None else first_step
            dying["in"] = kills.get(step, "") if first_step < step else ""
            if dying["in"] == "between":
                die()
            if dying["in"] == "stop":
                time.sleep(0.5)  # PyTorch 2.x notes the last collective's end first
                say(f"stopping {rank} {time.time():.6f}")
                os.kill(os.getpid(), signal.SIGSTOP)
            optimizer.zero_grad(set_to_none=True)
            for micro, (images, labels) in enumerate(batches.get(step)):
                dying["micro"] = micro
                if micro == 0:
                    with job.model.no_sync():  # accumulate: no all-reduce for the first
                        loss = nn.functional.cross_entropy(job.model(images), labels) / 2
                        loss.backward()
                else:
                    loss = nn.functional.cross_entropy(job.model(images), labels) / 2
                    if args.step_seconds:
                        time.sleep(args.step_seconds)
                    loss.backward()
            optimizer.step()
            scheduler.step()
            job.commit()
            if rank == 0 and job.step % 10 == 0:
                say(f"step {job.step} loss {loss.item() * 2:.4f} "
                    f"lr {scheduler.get_last_lr()[0]:g}")
        if job.recoveries != recoveries:
            recoveries = job.recoveries
            say(f"lost {rank} {job.last_lost_time:.6f}")
            resumed = True
        elif resumed:
            say(f"resumed {rank} {time.time():.6f}")
            resumed = False
    trained = time.perf_counter() - began

    if kills.get(args.steps) == "end":
        die()
    buffers = [b for b in net.buffers()]
    rng = [torch.get_rng_state()]
    say(f"state {rank} params {digest(list(net.parameters()))} buffers {digest(buffers)} "
        f"optimizer {digest(tensors_of(optimizer.state_dict()))} "
        f"scheduler {digest(sorted(scheduler.state_dict().items()))} rng {digest(rng)} "
        f"tracked {int(net.bn.num_batches_tracked)}")
    if rank == 0:
        say(f"recoveries {job.recoveries}")
        say(f"trained {trained:.6f}")


if __name__ == "__main__":
    main()
