"""Prints one line, `paths {json}`: this process's PYTHONPATH (None when unset) and sys.path,
and a child Python's. Under ddprun it must print what it prints under a plain python with the
same PYTHONPATH. Used by tests/launcher/agent/python_probe_safety_test.cpp."""

import json
import os
import subprocess
import sys

CODE = "import json, os, sys; print(json.dumps([os.environ.get('PYTHONPATH'), sys.path]))"
child = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, check=True)
print("paths " + json.dumps({"pythonpath": os.environ.get("PYTHONPATH"), "sys_path": sys.path,
                             "child": json.loads(child.stdout)}), flush=True)
