"""Offers ddprun's own Python package (`ddprun.inplace`) to a worker under
--restart_policy=inplace where it is not installed: its folder, beside the probe's, goes last on
sys.path (an installed one comes first), when no other user can write to it. Used by
sitecustomize (an exec'd worker) and the warm template (a forked one, whose template started
without the variable)."""

import os
import sys

import _ddprun_contract


def offer(probe_folder):
    if _ddprun_contract.INPLACE_GENERATION not in os.environ:
        return
    package = os.path.join(os.path.dirname(probe_folder), "python-package")
    if package in sys.path:
        return
    try:
        status = os.stat(package)
    except OSError:
        return
    if status.st_mode & 0o022 or status.st_uid not in (0, os.getuid()):
        return
    sys.path.append(package)
