#!/usr/bin/env python3
"""ddprun.inplace's parts in one process, against the PyTorch of the Python that runs it (both
peers): a rank's record through bytes and back, the job's checkpoints (the newest complete one,
the last two kept), and the watcher's connection (a wait that a set ends, and a close that ends
a wait in silence) against PyTorch's own TCPStore server. Exits 77 (a skip, with its reason)
where torch.distributed cannot be imported.

    inplace_unit_test.py PYTHON_PACKAGE_DIR
"""

import os
import sys
import tempfile
import threading
from datetime import timedelta

try:
    import torch
    import torch.distributed as dist
except Exception as error:  # noqa: BLE001 - any reason is a reason to skip
    print(f"SKIP: {sys.executable} cannot import torch.distributed ({error})")
    sys.exit(77)

sys.path.insert(0, sys.argv[1])
from ddprun import inplace  # noqa: E402

failures = []


def check(condition, what):
    print(("ok   " if condition else "FAIL ") + what)
    if not condition:
        failures.append(what)


# A record through bytes: every dtype a buffer or a generator's state has, and empty ones.
encoder = inplace._Encoder()
rng = inplace._rng_states()
buffers = [torch.randn(3, 4), torch.tensor(7), torch.zeros(0), torch.randn(5).bfloat16(),
           torch.tensor([True, False])]
record = inplace._decode_record(encoder.encode(12, rng, buffers))
check(record["step"] == 12, "record: its step")
check(torch.equal(record["rng"]["torch"], rng["torch"]) and record["rng"]["python"] == rng["python"],
      "record: torch's and Python's generator states")
check(all(a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
          for a, b in zip(record["buffers"], buffers)), "record: buffers of every dtype")
again = inplace._decode_record(encoder.encode(13, rng, None))  # the cached encodings
check(again["rng"]["python"] == rng["python"] and again["buffers"] is None,
      "record: the Python state's encoding used again; no buffers")

# numpy's global generator replaced by another kind (numpy 1.25+): its state read and set back
# without the warning get_state() prints for it.
import warnings  # noqa: E402

import numpy  # noqa: E402

if hasattr(numpy.random, "set_bit_generator"):
    saved_bits = numpy.random.get_bit_generator()
    numpy.random.set_bit_generator(numpy.random.PCG64(7))
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        before = inplace._rng_states()
        drawn = numpy.random.rand()
        inplace._set_rng_states(before)
        again = numpy.random.rand()
    check(drawn == again and not warned, "rng: a PCG64 global generator's state, set back")
    encoder2 = inplace._Encoder()
    encoder2.encode(1, before, None)
    record = inplace._decode_record(encoder2.encode(2, before, None))  # its cached encoding
    check(record["rng"]["numpy"] == before["numpy"], "record: a PCG64 state through bytes")
    numpy.random.set_bit_generator(saved_bits)

check(inplace._copies([], []) == [], "copies: a model without buffers")
saved = inplace._copies(buffers)
buffers[0].add_(1)
check(inplace._copies(buffers, saved) is saved and torch.equal(saved[0], buffers[0]),
      "copies: into the same tensors, a step later")

# Checkpoints: two ranks, steps 10, 20, 30; rank 1 never wrote 30.
with tempfile.TemporaryDirectory() as folder:
    ranks = [inplace._Checkpoints(folder, 10, rank, 2) for rank in (0, 1)]
    for step in (10, 20, 30):
        for rank, checkpoints in enumerate(ranks):
            if step == 30 and rank == 1:
                continue
            shared = {"model": {"w": torch.full((2,), float(step))}, "layout": None,
                      "kept": {}} if rank == 0 else None
            checkpoints.save(step, shared, {"rng": rng, "buffers": []})
    left = {name: sorted(os.listdir(os.path.join(folder, name))) for name in os.listdir(folder)}
    check(left == {"step-10": ["rank-1.pt"], "step-20": ["rank-0.pt", "rank-1.pt", "shared.pt"],
                   "step-30": ["rank-0.pt", "shared.pt"]},
          "checkpoints: each rank keeps its last two (%s)" % left)
    found = inplace._Checkpoints(folder, 10, 1, 2).load()
    check(found is not None and found[0] == 20 and float(found[1]["model"]["w"][0]) == 20.0,
          "checkpoints: the newest complete one (20: rank 1 never wrote 30)")
    check(inplace._Checkpoints(folder, 10, 0, 3).load() is None,
          "checkpoints: none complete for 3 ranks")
try:
    inplace._Checkpoints("/tmp", 0, 0, 1)
    check(False, "checkpoints: every=0 refused")
except ValueError:
    check(True, "checkpoints: every=0 refused")

# The watcher's connection, against PyTorch's own server.
server = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=30),
                       wait_for_workers=False)
client = dist.TCPStore("127.0.0.1", server.port, 1, False, timeout=timedelta(seconds=30))
waiter = inplace._Connection("127.0.0.1", server.port)
outcome = {}


def wait(key):
    try:
        waiter.wait(key)
        outcome[key] = "returned"
    except OSError as error:
        outcome[key] = f"OSError {error}"


thread = threading.Thread(target=wait, args=("ddprun/inplace/0/g1/announced",))
thread.start()
client.set("ddprun/inplace/0/g1/announced", "2")
thread.join(10)
check(outcome.get("ddprun/inplace/0/g1/announced") == "returned",
      "waiter: the program's key ends the wait (%s)" % outcome)
waiter.set("ddprun/inplace/0/g1/stuck", "rank 3 is still in a collective")
check(client.get("ddprun/inplace/0/g1/stuck") == b"rank 3 is still in a collective",
      "waiter: a set reads back through PyTorch's client")
record = bytes(range(256)) * 40
waiter.set("ddprun/inplace/0/rank1/s0", record)
check(client.get("ddprun/inplace/0/rank1/s0") == record, "waiter: a record's bytes, set in one send")
thread = threading.Thread(target=wait, args=("never",))
thread.start()
waiter.close()
thread.join(10)
check(not thread.is_alive() and outcome.get("never", "").startswith("OSError"),
      "waiter: close() ends a wait with OSError (%s)" % outcome)

print(f"{len(failures)} failed" if failures else "all passed")
sys.exit(1 if failures else 0)
