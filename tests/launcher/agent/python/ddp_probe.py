"""Prints one line "probe <json>" describing how ddprun started this worker: argv, the
interpreter, whether it ran as a module, and torchrun's environment variables.
Used by tests/launcher/agent/agent_test.cpp as a script, as a module (-m ddp_probe) and directly."""
import json
import os
import sys

KEYS = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"]
line = "probe " + json.dumps({
    "argv": sys.argv[1:],
    "executable": sys.executable,
    "name": __name__,
    "unbuffered": sys.stdout.write_through,
    "env": {k: os.environ.get(k) for k in KEYS},
})
sys.stdout.write(line + "\n")  # one write: lines of ranks sharing a console stay whole
sys.stdout.flush()
