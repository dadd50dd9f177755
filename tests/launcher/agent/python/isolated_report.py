"""Prints one line, `isolated {json}`: this process's environment variable names, its open
descriptors above 2, its sys.flags that keep ddprun's probe out (-I, -E, -S), and whether a plain
Python child (sys.executable, which honours PYTHONPATH) loaded any module of ddprun's. Under
ddprun (RANK set) it also does a Gloo all_reduce first, unless Python runs without site (-S:
no dist-packages, no torch), so that PyTorch reads the Flight Recorder's variables. Run through
a PYTHON_EXEC that starts Python isolated, by tests/launcher/agent/python_probe_safety_test.cpp."""

import json
import os
import subprocess
import sys

if "RANK" in os.environ and not sys.flags.no_site:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    dist.destroy_process_group()

CODE = "import sys; print(sorted(m for m in sys.modules if m.startswith('_ddprun')))"
child = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, check=True)
descriptors = []
for fd in range(3, 256):
    try:
        os.fstat(fd)
        descriptors.append(fd)
    except OSError:
        pass
line = "isolated " + json.dumps({
    "names": sorted(os.environ),
    "descriptors": descriptors,
    "flags": [sys.flags.isolated, sys.flags.ignore_environment, sys.flags.no_site],
    "child_modules": child.stdout.strip(),
}) + "\n"
os.write(1, line.encode())  # one write: the two ranks' lines never interleave (python -u)
