"""What a step pays for what in-place recovery keeps (scripts/bench-inplace, BENCH_ONLY=cnn):
examples/pytorch/inplace_cnn.py's step, on one rank in this process (nothing else competes for
the CPU), under plain DDP and under ddprun.inplace's Job (generation 0, its store served here),
alternating. Prints `plain <ms per step>` and `inplace <ms per step>`, the medians of ROUNDS,
and `plain_cpu`, `inplace_cpu`: the process's CPU time per step.

    python inplace_step_cost.py BUILD_DIR [STEPS] [ROUNDS]
"""

import importlib.util
import os
import statistics
import sys
import time
from datetime import timedelta

build = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 300
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 5
sys.path.insert(0, os.path.join(build, "share", "ddprun", "python-package"))
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

torch.set_num_threads(1)
here = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location(
    "inplace_cnn", os.path.join(here, "..", "examples", "pytorch", "inplace_cnn.py"))
cnn = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cnn)

server = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=30),
                       wait_for_workers=False)
os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                  MASTER_PORT=str(server.port), TORCHELASTIC_USE_AGENT_STORE="True")
from ddprun import inplace  # noqa: E402


def train(kept):
    """(wall, CPU) seconds per step of `steps` steps (after 10 warm-up steps); CPU: this
    process's threads, which a loaded machine changes less than the wall time."""
    os.environ.pop(inplace.GENERATION_VARIABLE, None)
    os.environ["TORCHELASTIC_RESTART_COUNT"] = str(time.monotonic_ns())  # keys of its own
    if kept:
        os.environ[inplace.GENERATION_VARIABLE] = "0"
    torch.manual_seed(0)
    net = cnn.Net()
    job = inplace.Job("gloo")
    job.wrap(net, bucket_cap_mb=0.005)
    optimizer = torch.optim.Adam(net.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.5)
    job.keep(optimizer=optimizer, scheduler=scheduler)
    batches = cnn.Batches(cnn.dataset(), 0, 1, 0)
    began = None
    while job.step < steps + 10:
        if job.step == 10:
            began, cpu_began = time.perf_counter(), time.process_time()
        with job.attempt():
            optimizer.zero_grad(set_to_none=True)
            for micro, (images, labels) in enumerate(batches.get(job.step)):
                if micro == 0:
                    with job.model.no_sync():
                        nn_loss = torch.nn.functional.cross_entropy(job.model(images), labels)
                        (nn_loss / 2).backward()
                else:
                    nn_loss = torch.nn.functional.cross_entropy(job.model(images), labels)
                    (nn_loss / 2).backward()
            optimizer.step()
            scheduler.step()
            job.commit()
    took = ((time.perf_counter() - began) / steps, (time.process_time() - cpu_began) / steps)
    dist.destroy_process_group()
    job._stopping = True
    if job._waiter is not None:
        job._waiter.close()
    return took


results = {"plain": [], "inplace": []}
for round_ in range(rounds):  # each first in every other round: neither gains from going first
    for kept in ((False, True) if round_ % 2 == 0 else (True, False)):
        results["inplace" if kept else "plain"].append(train(kept))
for name, values in results.items():
    print(f"{name} {statistics.median(v[0] for v in values) * 1000:.3f}")
    print(f"{name}_cpu {statistics.median(v[1] for v in values) * 1000:.3f}")
