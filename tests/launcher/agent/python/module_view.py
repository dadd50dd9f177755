# What a -m worker sees (issue 36): sys.path[0], sys.argv and its own stack, printed as one
# "view {...}" line; then, as Hydra's job.chdir does, it changes into the folder given and
# imports a module of the folder it started in; with "fail" it raises.
import json
import os
import sys
import traceback

view = {"path0": sys.path[0], "argv": sys.argv, "cwd": os.getcwd(),
        "stack": [[frame.filename, frame.name] for frame in traceback.extract_stack()],
        "warm": "torch" in sys.modules}  # imported by nothing here: a warm template's
os.chdir(sys.argv[1])
import module_view_sibling  # noqa: E402,F401  (a top-level module of the start folder)

print("view " + json.dumps(view), flush=True)
if "fail" in sys.argv:
    raise ValueError("module_view failed")
