# Prints PyTorch's DistributedSampler indices (shuffle off) for the cases given as
# "size,replicas,rank,drop_last" arguments: one line per case, indices space-separated.
import sys

from torch.utils.data import DistributedSampler

for case in sys.argv[1:]:
    size, replicas, rank, drop_last = (int(x) for x in case.split(","))
    sampler = DistributedSampler(range(size), num_replicas=replicas, rank=rank,
                                 shuffle=False, drop_last=bool(drop_last))
    print(" ".join(str(i) for i in sampler))
