"""A worker that writes what it sees, so that a worker forked from ddprun's warm template can be
compared field by field with an exec'd one (warm_start_test.cpp).

warm_fields.py OUT [crash]: after a Gloo all_reduce, writes OUT/a<attempt>_r<rank>.json; in
attempt 0 with "crash", rank 1 then exits with code 3 (so that ddprun restarts the group).
"""

import ctypes
import json
import os
import random
import re
import resource
import signal
import sys

import numpy
import torch
import torch.distributed as dist


_KEEP = []


def streams():
    seen = {}
    for name in ("stdin", "stdout", "stderr"):
        stream = getattr(sys, name)
        buffer = getattr(stream, "buffer", None)
        raw = getattr(buffer, "raw", buffer)
        seen[name] = {
            "type": type(stream).__name__, "buffer": type(buffer).__name__,
            "raw_name": getattr(raw, "name", None), "fileno": stream.fileno(),
            "encoding": stream.encoding, "errors": stream.errors, "mode": stream.mode,
            "line_buffering": stream.line_buffering, "write_through": stream.write_through,
            "isatty": stream.isatty(), "is_dunder": stream is getattr(sys, "__%s__" % name),
        }
    return seen


def descriptors():
    seen = {}
    for name in sorted(os.listdir("/proc/self/fd"), key=int):
        try:
            link = os.readlink("/proc/self/fd/" + name)
        except OSError:
            continue  # the listing's own
        link = re.sub(r"(pipe|socket|anon_inode):\[\d+\]", r"\1", link)
        link = re.sub(r"attempt_\d+", "attempt_N", link)
        link = re.sub(r" \(deleted\)$", "", link)
        seen[name] = link
    return seen


def main():
    out, crash = sys.argv[1], len(sys.argv) > 2 and sys.argv[2] == "crash"
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    libc = ctypes.CDLL(None)
    death = ctypes.c_int(0)
    libc.prctl(2, ctypes.byref(death), 0, 0, 0)  # PR_GET_PDEATHSIG
    umask = os.umask(0)
    os.umask(umask)
    main_module = sys.modules["__main__"]
    volatile = ("TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_ERROR_FILE", "DDPRUN_MODULES_FILE",
                "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_FR_DUMP_TEMP_FILE")
    with open("/proc/self/cmdline", "rb") as f:  # as ps and pgrep -f read it
        cmdline = f.read().replace(b"\0", b" ").decode().rstrip(" ")
    with open("/proc/self/environ", "rb") as f:
        environ = sorted(e.decode() for e in f.read().split(b"\0")
                         if e and e.split(b"=")[0].decode() not in volatile)
    fields = {
        "argv": sys.argv, "orig_argv": getattr(sys, "orig_argv", None), "path": sys.path,
        "cwd": os.getcwd(), "flags": list(sys.flags), "executable": sys.executable,
        "env": {k: v for k, v in os.environ.items() if k not in volatile},
        "proc_cmdline": cmdline, "proc_environ": environ,
        "main": {"name": main_module.__name__, "file": main_module.__dict__.get("__file__"),
                 "is_this": main_module.__dict__ is globals(),
                 "keys": sorted(k for k in vars(main_module) if k.startswith("__")),
                 "loader": type(main_module.__loader__).__name__,
                 "spec": re.sub(r" at 0x[0-9a-f]+", "", repr(__spec__)),
                 "cached": main_module.__dict__.get("__cached__", "absent")},
        "streams": streams(), "descriptors": descriptors(),
        "signals": {str(s): repr(signal.getsignal(s)) for s in range(1, signal.NSIG)
                    if s not in (signal.SIGKILL, signal.SIGSTOP) and s < 32},
        "mask": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
        "rlimits": {name: resource.getrlimit(getattr(resource, name))
                    for name in dir(resource) if name.startswith("RLIMIT_")},
        "umask": umask, "affinity": sorted(os.sched_getaffinity(0)),
        "scheduler": os.sched_getscheduler(0), "nice": os.getpriority(os.PRIO_PROCESS, 0),
        "own_group": os.getpgid(0) == os.getpid(), "own_session": os.getsid(0) == os.getpid(),
        "ppid": os.getppid(), "parent_death_signal": death.value,
        "probe": "_ddprun_probe" in sys.modules,
        "torch_seed": torch.initial_seed(),
    }
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    value = torch.ones(4)
    _KEEP.append(value)  # (as in warm_job.py: no Gloo thread drops it while Python finalizes)
    dist.all_reduce(value)
    draws = {"random": random.random(), "numpy": float(numpy.random.rand())}
    with open(os.path.join(out, "a%d_r%d.json" % (attempt, rank)), "w") as f:
        json.dump({"fields": fields, "draws": draws, "sum": value.tolist()}, f)
    print("fields written: attempt %d rank %d" % (attempt, rank), flush=True)
    dist.barrier()
    if crash and attempt == 0 and rank == 1:
        sys.exit(3)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
