#!/usr/bin/python3
"""Fashion-MNIST data-parallel training in PyTorch: the same job as build/bin/train_fashion_mnist.

Same model (784 -> 512 -> ReLU -> 512 -> ReLU -> 10), same initial weights (drawn from the
same SplitMix64 stream, or loaded from a file the C++ trainer dumped with --dump_init), same
data order (libddp's DistributedSampler permutation, reimplemented below), same
hyper-parameters and SGD with momentum; DistributedDataParallel over Gloo (--device cpu, the
default) or NCCL (--device cuda: one GPU per rank, PyTorch 2.x). Runs unchanged under
ddprun and torchrun:

    build/bin/ddprun --standalone --nproc_per_node=2 examples/pytorch/train_fashion_mnist.py
    scripts/torchrun-py311 --standalone --nproc_per_node=2 examples/pytorch/train_fashion_mnist.py
"""
import argparse
import gzip
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

DEFAULT_DATA = "/usr/share/datasets/fashion-mnist"
MASK = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15
PIXEL_MEAN, PIXEL_STD = 0.2860, 0.3530  # of the training set's pixel / 255


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=DEFAULT_DATA, help="directory with the IDX files")
    p.add_argument("--batch_size", type=int, default=128, help="images per rank per step")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--seed", type=int, default=0, help="initial weights and data order")
    p.add_argument("--train_limit", type=int, default=0, help="first N training images (0: all)")
    p.add_argument("--test_limit", type=int, default=0, help="first N test images (0: all)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cpu: Gloo; cuda: NCCL, the GPU of this rank's LOCAL_RANK")
    p.add_argument("--print_losses", action="store_true", help="rank 0 prints every step's loss")
    p.add_argument("--init", help="initial weights from train_fashion_mnist --dump_init FILE")
    return p.parse_args()


# --- data -------------------------------------------------------------------------------

def read_idx(path, magic, dims):
    """The array of an IDX file (plain or .gz); SystemExit naming the file when it is wrong."""
    if not os.path.exists(path) and os.path.exists(path + ".gz"):
        path += ".gz"
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError) as e:
        sys.exit(f"train_fashion_mnist.py: {path}: {e} (install dataset-fashion-mnist or pass --data)")
    header = 4 + 4 * dims
    if len(data) < header or int.from_bytes(data[:4], "big") != magic:
        sys.exit(f"train_fashion_mnist.py: {path}: not an IDX file with magic {magic:#010x}")
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    if len(data) != header + int(np.prod(shape)):
        sys.exit(f"train_fashion_mnist.py: {path}: {len(data)} bytes, header says {header + np.prod(shape)}")
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(shape)


def load_split(data_dir, prefix, limit):
    images = read_idx(os.path.join(data_dir, f"{prefix}-images-idx3-ubyte"), 0x803, 3)
    labels = read_idx(os.path.join(data_dir, f"{prefix}-labels-idx1-ubyte"), 0x801, 1)
    if limit:
        images, labels = images[:limit], labels[:limit]
    x = images.reshape(len(images), 784).astype(np.float32) / np.float32(255)
    x = (x - np.float32(PIXEL_MEAN)) / np.float32(PIXEL_STD)  # as fmnist::normalize
    x = torch.from_numpy(x)
    return x, torch.from_numpy(labels.astype(np.int64))


# --- libddp's generator, sampler and initial weights ----------------------------------------

class SplitMix64:
    def __init__(self, seed):
        self.state = seed & MASK

    def next(self):
        self.state = (self.state + GAMMA) & MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        return z ^ (z >> 31)

    def below(self, bound):
        limit = MASK - (MASK % bound)
        while True:
            x = self.next()
            if x < limit:
                return x % bound


def sampler_indices(size, world, rank, seed, epoch):
    """ddp::DistributedSampler(shuffle=True, drop_last=False).indices() after set_epoch."""
    order = list(range(size))
    rng = SplitMix64(seed + epoch)
    for i in range(size, 1, -1):
        j = rng.below(i)
        order[i - 1], order[j] = order[j], order[i - 1]
    per_rank = (size + world - 1) // world
    order += order[: per_rank * world - size]  # pad by wrapping around (never past size here)
    return order[rank::world]


def splitmix_uniform(seed, start, count, bound):
    """Outputs start+1 .. start+count of SplitMix64(seed) as fmnist::SplitMix64::uniform_symmetric."""
    with np.errstate(over="ignore"):
        k = np.arange(start + 1, start + count + 1, dtype=np.uint64)
        z = np.uint64(seed) + k * np.uint64(GAMMA)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    u = (z >> np.uint64(40)).astype(np.float64) / 16777216.0
    return ((2.0 * u - 1.0) * bound).astype(np.float32)


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 512)
        self.fc2 = nn.Linear(512, 512)
        self.fc3 = nn.Linear(512, 10)

    def forward(self, x):
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


def initialise(model, seed, init_file):
    """The C++ trainer's initial weights: from its --dump_init file, or the same stream."""
    flat = np.fromfile(init_file, dtype=np.float32) if init_file else None
    drawn = 0
    with torch.no_grad():
        for layer in (model.fc1, model.fc2, model.fc3):
            bound = 1.0 / np.sqrt(float(layer.in_features))
            for p in (layer.weight, layer.bias):  # registration order
                if flat is not None:
                    values = flat[drawn:drawn + p.numel()]
                else:
                    values = splitmix_uniform(seed, drawn, p.numel(), bound)
                p.copy_(torch.from_numpy(values.copy()).view_as(p))
                drawn += p.numel()
    if flat is not None and drawn != flat.size:
        sys.exit(f"train_fashion_mnist.py: {init_file}: {flat.size} floats, the model has {drawn}")


# --- training ---------------------------------------------------------------------------

def evaluate(model, x, y, rank, world):
    """Test loss and accuracy over the whole split, each rank taking every world-th image."""
    with torch.no_grad():
        logits = model(x[rank::world])
        labels = y[rank::world]
        sums = torch.tensor([F.cross_entropy(logits, labels, reduction="sum").item(),
                             (logits.argmax(1) == labels).sum().item(), len(labels)],
                            dtype=torch.float64, device=x.device)
    dist.all_reduce(sums)
    return sums[0].item() / sums[2].item(), int(sums[1].item()), int(sums[2].item())


def train_epoch(ddp_model, opt, train, order, args, rank, world, step):
    """One epoch over this rank's sample indices `order` (a tensor on the data's device)."""
    x, y = train
    total, losses = len(order), []
    for start in range(0, total, args.batch_size):
        idx = order[start:start + args.batch_size]
        loss = F.cross_entropy(ddp_model(x[idx]), y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        # On a GPU .item() waits for the step; keep the loss on the device unless it is printed
        # (the C++ trainer also reads its losses back only now and then).
        losses.append(loss.item() if x.device.type == "cpu" or args.print_losses
                      else loss.detach())
        if args.print_losses and rank == 0:
            print(f"step {step} loss {losses[-1]:.9g}", flush=True)
        step += 1
    losses = [float(v) for v in losses]
    mean = torch.tensor([sum(losses) / max(len(losses), 1)], dtype=torch.float64,
                        device=x.device)
    dist.all_reduce(mean)
    return mean.item() / world, total * world, step


def train(args, rank, world, device):
    train_split = [t.to(device) for t in load_split(args.data, "train", args.train_limit)]
    test_split = [t.to(device) for t in load_split(args.data, "t10k", args.test_limit)]
    model = Mlp()
    initialise(model, args.seed, args.init)
    model.to(device)
    # Broadcasts rank 0's weights.
    ddp_model = DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
    opt = torch.optim.SGD(ddp_model.parameters(), lr=args.lr, momentum=args.momentum)
    step = 0
    for epoch in range(args.epochs):
        # The order comes from a pure-Python copy of libddp's sampler (~0.06 s an epoch, where
        # torch's DistributedSampler would take a millisecond): drawn before the clock starts,
        # as the C++ trainer does, so that samples/s times training alone.
        order = sampler_indices(len(train_split[1]), world, rank, args.seed, epoch)
        order = torch.tensor(order).to(device)
        start = time.perf_counter()
        train_loss, samples, step = train_epoch(ddp_model, opt, train_split, order, args, rank,
                                                world, step)
        train_seconds = time.perf_counter() - start
        test_loss, correct, count = evaluate(model, *test_split, rank, world)
        if rank == 0:
            print(f"epoch {epoch + 1}/{args.epochs}: train loss {train_loss:.4f}, "
                  f"test loss {test_loss:.4f}, test accuracy {100 * correct / count:.2f}% "
                  f"({correct}/{count}), {time.perf_counter() - start:.1f} s, "
                  f"{samples / train_seconds:.0f} samples/s", flush=True)


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    if args.device == "cuda":
        if not torch.cuda.is_available():
            sys.exit("train_fashion_mnist.py: --device cuda: PyTorch sees no CUDA device")
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl")
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    train(args, dist.get_rank(), dist.get_world_size(), device)
    # The DDP model is gone with train()'s frame. Left to interpreter shutdown, its process
    # group's destructor joins a Gloo thread that waits for the GIL: PyTorch 1.13 on
    # Python 3.11 then hangs at exit now and then.
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
