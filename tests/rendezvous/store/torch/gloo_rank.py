"""One rank of a Gloo job whose ranks meet through the store at 127.0.0.1:PORT (a client
connection, like TORCHELASTIC_USE_AGENT_STORE). Prints the all-reduced sum."""
import datetime
import sys

import torch
import torch.distributed as dist

port, rank, world = (int(a) for a in sys.argv[1:4])
store = dist.TCPStore("127.0.0.1", port, world, False, timeout=datetime.timedelta(seconds=60))
store = dist.PrefixStore("/worker/attempt_0", store)
dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
dist.barrier()
print(f"sum {int(t.item())}", flush=True)
dist.destroy_process_group()
