"""Ordinary programs that ran differently in a worker forked from ddprun's warm template than in
an exec'd one (issue 34), for warm_cases_test.cpp: warm_cases.py CASE OUT [ARG...].

Attempt 0 (TORCHELASTIC_RESTART_COUNT=0) is exec'd: each rank writes what it sees to
OUT/a0_r<rank>.json, then rank 1 waits until the warm template has imported what the lists
named and exits with code 3. Attempt 1 (warm, or cold with one line saying why) writes
OUT/a1_r<rank>.json and exits 0. The test compares the two. CASE:
- same: sets OMP_NUM_THREADS, TORCH_DISTRIBUTED_DEBUG and PYTORCH_JIT before `import torch`;
  writes through the log its sitecustomize opened (WARM_STARTUP_LOG, appended to) and has
  faulthandler use it; changes directory and reads its own source; reports its command line
  (the test gives a long argument), logging's relativeCreated and its multiprocessing authkey,
  and what an import set in os.environ (PyTorch 2.x's torch._dynamo);
- rank: imports warm_rank_reader (installed), which reads RANK and the restart count at import;
- rank_again: as rank, and rank 1 fails in attempt 1 too (attempt 2 is forked as well);
- edit: imports warm_pkg (installed), whose __init__ imports warm_pkg.helper; rank 1 edits
  the package's __init__.py in attempt 0;
- pth: attempt 0's rank 1 installs warm_new_pkg through a new .pth file in the user site folder
  (PYTHONUSERBASE); attempt 1 imports it;
- env_always: as same's environment, under --warm_start=always (attempt 0 is the one compared
  with a cold run by the test);
- plain: as same, without setting the environment;
- per_rank_env: sets OMP_NUM_THREADS to 1 + LOCAL_RANK before `import torch`;
- restart_env: sets TORCH_DISTRIBUTED_DEBUG from the restart count (OFF, then DETAIL) before it;
- site_effects: what torch's import saw of the site start-up's (its sitecustomize installs an
  import hook, or sets OMP_NUM_THREADS per rank, as the test asks);
- by_design: imports warm_import_state (installed), whose import depends on the process (pid,
  argv, clock, a temporary folder, random draws, an at-fork hook, a SIGUSR1 handler, and the
  program's own copy of a module that is also installed); reads what its sitecustomize noted at
  start-up (LOCAL_RANK); raises RLIMIT_STACK and pickles a deeply nested list.
"""

import os
import sys

if sys.argv[1] in ("same", "env_always"):
    os.environ["OMP_NUM_THREADS"] = "2"
    os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    os.environ["PYTORCH_JIT"] = "0"
elif sys.argv[1] == "per_rank_env":
    os.environ["OMP_NUM_THREADS"] = str(1 + int(os.environ["LOCAL_RANK"]))
elif sys.argv[1] == "restart_env":
    restarted = os.environ["TORCHELASTIC_RESTART_COUNT"] != "0"
    os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL" if restarted else "OFF"

import hashlib  # noqa: E402
import inspect  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import multiprocessing  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from warm_job import wait_for_template  # noqa: E402

_KEEP = []


def environment_effects():
    jit = torch.jit._state._enabled
    return {
        "threads": torch.get_num_threads(),
        "debug_level": str(dist.get_debug_level()),
        "jit_enabled": bool(getattr(jit, "enabled", jit)),
    }


def process_age_ms():
    """How long ago this process started (a forked worker: its fork)."""
    with open("/proc/self/stat") as stat:
        start_ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as uptime:
        up = float(uptime.read().split()[0])
    return (up - start_ticks / os.sysconf("SC_CLK_TCK")) * 1000


def same_fields():
    fields = environment_effects()
    fields["file"] = __file__
    here = os.getcwd()
    os.chdir("/")
    try:
        fields["source_found"] = "def same_fields" in inspect.getsource(same_fields)
    except OSError as error:
        fields["source_found"] = str(error)
    os.chdir(here)
    with open("/proc/self/cmdline", "rb") as cmdline:
        fields["cmdline_sha"] = hashlib.sha256(cmdline.read()).hexdigest()
    import sitecustomize

    log = getattr(sitecustomize, "LOG", None)
    if log is not None:  # the log the interpreter's start-up opened
        log.write("attempt %s rank %s\n" % (os.environ["TORCHELASTIC_RESTART_COUNT"],
                                            os.environ["RANK"]))
        log.flush()
        fields["log_fd_is_file"] = os.readlink("/proc/self/fd/%d" % log.fileno())
    try:  # PyTorch 2.x: importing torch._dynamo sets TORCHINDUCTOR_CACHE_DIR in os.environ
        import torch._dynamo  # noqa: F401
    except ImportError:
        pass
    fields["inductor_cache_dir"] = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "m", None, None)
    fields["relative_created_ok"] = record.relativeCreated <= process_age_ms() + 1000
    return fields


def by_design_fields():
    """What an import that depends on the process made (warm_import_state), what the
    sitecustomize noted, and how deep the main thread's stack reaches: as in an exec'd
    worker. Returns (fields compared with attempt 0, values that must differ between ranks)."""
    import pickle
    import resource
    import signal
    import sitecustomize
    import time

    import warm_import_state as state

    fields = {
        "startup_rank_is_own": getattr(sitecustomize, "STARTUP_RANK", None) ==
        os.environ["LOCAL_RANK"],
        "pid_is_own": state.PID == os.getpid(),
        "prog": state.PROG,
        "started_in_this_process": state.STARTED >= time.time() - process_age_ms() / 1000 - 1,
        "tmp_exists": os.path.isdir(state.TMP),
        "after_fork": state.AFTER_FORK,
        "shadow": state.SHADOW,
    }
    os.kill(os.getpid(), signal.SIGUSR1)
    fields["usr1_handled"] = state.USR1 == [signal.SIGUSR1]
    # A program that needs a deep stack raises its limit (or runs under ulimit -s unlimited).
    soft, hard = resource.getrlimit(resource.RLIMIT_STACK)
    want = 256 << 20
    if hard == resource.RLIM_INFINITY or hard >= want:
        resource.setrlimit(resource.RLIMIT_STACK, (want, hard))
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(1000000)
    nested = []
    for _ in range(200000):
        nested = [nested]
    try:
        fields["deep_pickle"] = len(pickle.dumps(nested))
    except RecursionError:
        fields["deep_pickle"] = "RecursionError"
    sys.setrecursionlimit(limit)
    return fields, {"tmp": state.TMP, "session": state.SESSION, "draw": state.DRAW}


def main():
    case, out = sys.argv[1], sys.argv[2]
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    fields = {}
    per_process = None
    if case in ("same", "plain", "env_always"):
        fields = environment_effects() if case == "env_always" else same_fields()
        authkey = bytes(multiprocessing.current_process().authkey)
        fields_authkey = hashlib.sha256(authkey).hexdigest()
    elif case in ("per_rank_env", "restart_env"):
        fields = environment_effects()
    elif case == "site_effects":
        fields = environment_effects()
        fields["hooked"] = any(type(f).__name__ == "_Hook" for f in sys.meta_path)
    elif case == "by_design":
        fields, per_process = by_design_fields()
    elif case in ("rank", "rank_again"):
        import warm_rank_reader

        fields = {"rank": warm_rank_reader.RANK, "restarts": warm_rank_reader.RESTARTS}
    elif case == "edit":
        import warm_pkg

        fields = {"value": warm_pkg.VERSION}
    elif case == "pth" and attempt > 0:
        import warm_new_pkg

        fields = {"new_pkg": warm_new_pkg.NAME}
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    _KEEP.append(torch.ones(2))  # see warm_job.py's _KEEP
    dist.all_reduce(_KEEP[-1])
    result = {"fields": fields, "per_process": per_process}
    if case in ("same", "plain", "env_always"):
        result["authkey"] = fields_authkey
    with open(os.path.join(out, "a%d_r%d.json" % (attempt, rank)), "w") as f:
        json.dump(result, f)
    dist.barrier()
    if case == "rank_again" and attempt == 1 and rank == 1:
        sys.exit(3)
    if attempt == 0 and rank == 1 and case != "env_always":
        wait_for_template()
        if case == "edit":
            with open(sys.modules["warm_pkg"].__file__, "a") as f:
                f.write("VERSION = 2\n")
        if case == "pth":
            import site

            user_site = site.getusersitepackages()
            package = os.path.join(out, "new_pkg")
            os.makedirs(package, exist_ok=True)
            with open(os.path.join(package, "warm_new_pkg.py"), "w") as f:
                f.write("NAME = 'installed between attempts'\n")
            os.makedirs(user_site, exist_ok=True)
            with open(os.path.join(user_site, "warm_new.pth"), "w") as f:
                f.write(package + "\n")
        sys.exit(3)
    sys.stdout.write("attempt %d rank %d done\n" % (attempt, rank))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
