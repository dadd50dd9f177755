"""ddprun's warm template: one per node, it imports the framework (torch, and the modules the user
named in --warm_preload), never the program, then forks each worker when the agent asks, so that
a restarted worker starts with PyTorch loaded and imports the program's own modules itself, as
Python's multiprocessing forkserver does with its preload list.

The agent (launcher/process/worker_template.cpp) runs this file with the job's interpreter,
its interpreter flags and -S (no site start-up here: each worker runs its own), and the node's
worker environment (no rank's variables), with DDPRUN_TEMPLATE_FD naming a SOCK_SEQPACKET
socket. Requests are JSON messages; each gets one JSON reply (the names are _ddprun_contract's;
common/include/ddp/common/worker_contract.hpp lists every request and answer):
- {"op": "prepare", "preload": [modules], "lists": [paths], "own": [folders], "varying":
  [variables]}: imports the preload modules that are installed code (never from the program's
  own folders), skipping any that fails; then reads the workers' lists (_ddprun_modules) for
  the environment their own imports of what the template holds ran in; replies {"op":
  "prepared", "imported": N, "failed": N, "modules": all it holds, "seconds": S, "problem":
  text or null}, and writes a line of it to its own output (ddprun's warm_template.log). A
  problem (an import started a thread, opened a descriptor, printed, loaded the CUDA driver,
  read one of the "varying" variables; a worker imported torch after changing its environment)
  means this template must not fork: the agent starts the workers cold, saying why.
- {"op": "spawn", "program": path, "argv": [...], "env": ["K=V"...], "given": [the template's environment as
  ddprun gave it], "cwd": path, "cpus": [...], "fds": [target numbers], "guard": index or -1,
  "agent": pid, "blind": no worker has said what it imported yet}, with the descriptors
  (SCM_RIGHTS) in the order "fds" names their targets, then the group guard's channel:
  forks the worker; replies {"op": "spawned", "pid": P}, or {"op": "cold", "reason": text}
  when it must not fork (_ddprun_warm_checks says what is checked).
- EOF: the template exits.

The worker is forked twice: the template forks a child that forks the worker and exits, so that
the worker is re-parented to the agent (a child subreaper while it asks): the agent reaps it
and reads its exit status as an exec'd worker's. The worker then becomes what `python <flags>
<script or -c source> <args>` would have been: its own session, the agent's group guard told,
the parent-death signal, its descriptors (exactly the standard streams and the inherited ones,
at their numbers), CPUs, signal dispositions and mask as a fresh interpreter has them, the
environment, /proc/self/cmdline and environ (written over the template's, which
ddprun padded: DDPRUN_TEMPLATE_PAD and arguments of spaces), sys.argv, sys.orig_argv,
sys.path[0], new standard streams as Python's start-up makes them, numpy's global RandomState
and torch's CPU generator reseeded (Python's random reseeds itself at a fork), logging's start
time and multiprocessing's authkey anew, the site start-up run in the worker (its .pth files,
sitecustomize with ddprun's probe, usercustomize; sys.flags as without -S), a main thread whose
stack reaches as deep as an exec'd one's (_ddprun_frameless), and a fresh __main__ module, with an absolute __file__, that the entrypoint runs in, at this file's top
level: an exception it raises is printed with the traceback a fresh interpreter prints (this
file's frames trimmed), and its exit status is the same.

Shared with the template, unlike an exec'd worker: the hash seed (str hashes) and what the
preloaded modules (the framework) computed at import from anything _ddprun_warm_checks does not
check (docs/cli.md lists it).
"""

import io
import json
import os
import signal
import socket
import struct
import sys
import time

# What a fresh interpreter has, read before anything else runs here.
_FILE = __file__  # (Python 3.13 drops __main__.__file__ before it prints an uncaught exception)
_FOLDER = os.path.dirname(os.path.realpath(_FILE))
_SIGNALS = {}
for _number in range(1, signal.NSIG):
    try:
        _SIGNALS[_number] = signal.getsignal(_number)
    except (OSError, ValueError):
        pass
_MASK = signal.pthread_sigmask(signal.SIG_BLOCK, [])
_MAIN_KEYS = sorted(k for k in ("__annotations__",) if k in globals())
# The environment as the interpreter's start-up left it (a wrapper of the interpreter, a
# sitecustomize that sets variables, ddprun's giving PYTHONPATH back): each worker's gets the
# same changes (_set_environment).
_STARTUP_ENV = dict(os.environ)
# The environment this process was exec'd with (/proc/self/environ): ddprun's, with what a
# wrapper of the interpreter changed before it exec'd it.
try:
    with open("/proc/self/environ", "rb") as _environ:
        _EXEC_ENV = dict(os.fsdecode(_e).partition("=")[::2]
                         for _e in _environ.read().split(b"\0") if _e)
except OSError:
    _EXEC_ENV = dict(_STARTUP_ENV)
import _ddprun_contract as _contract  # noqa: E402  (from this file's folder; names only)
_STARTUP_FD = os.environ[_contract.TEMPLATE_FD]
import _ddprun_warm_checks as _checks  # noqa: E402  (from this file's folder; opens nothing)
import _ddprun_frameless as _frameless  # noqa: E402  (from this file's folder; opens nothing)

# The descriptors the interpreter's start-up opened (a .pth line or a sitecustomize that opens
# a log, faulthandler.enable(file=...)): an exec'd worker opens its own; a forked one keeps
# these at their numbers where sharing them is the same (_checks.StartupFiles).
_STARTUP_FDS = [_fd for _fd in _checks.open_fds() if _fd > 2 and _fd != int(_STARTUP_FD)]
for _name in (_contract.TEMPLATE_FD, _contract.TEMPLATE_PAD):  # for the template alone
    _STARTUP_ENV.pop(_name, None)
    _EXEC_ENV.pop(_name, None)
    os.environ.pop(_name, None)
# The interpreter's own command line up to this script: the real executable a wrapper exec'd.
_ORIG_PREFIX = list(getattr(sys, "orig_argv", []))
_ORIG_PREFIX = _ORIG_PREFIX[:_ORIG_PREFIX.index(sys.argv[0])] if sys.argv[0] in _ORIG_PREFIX else []
if _ORIG_PREFIX[-1:] == ["-S"]:
    del _ORIG_PREFIX[-1]  # the template's own flag (ddprun puts it last), not the workers'

import _ddprun_modules  # noqa: E402  (from this file's folder, sys.path[0] until here)

if sys.path and os.path.realpath(sys.path[0] or ".") == _FOLDER:
    del sys.path[0]  # a worker's sys.path[0] is its script's folder, set when it is forked
# ddprun starts the template without the site start-up (-S): each worker runs its own (.pth
# files, sitecustomize, usercustomize) after its fork, in its environment (_run_site). This is
# sys.path as the interpreter made it before that start-up: where a worker's site.py begins.
_SITE_IN_WORKER = bool(sys.flags.no_site)
_BASE_PATH = list(sys.path)


class _SiteFlag:
    """sys.flags.no_site, which the template's -S set and a worker's own start-up clears: the
    slot of the flags' tuple that holds it, found (and checked) at the template's start.
    sys.flags is a struct sequence, a tuple underneath, which Python offers no way to write."""

    def __init__(self):
        self.problem = None
        self.slot = None
        if not _SITE_IN_WORKER:
            return
        try:
            import ctypes

            names = getattr(type(sys.flags), "__match_args__", None)  # 3.10+
            index = names.index("no_site") if names else 6  # its place since Python 2
            # A tuple's items follow its header (ob_item: tuple's basic size, 3.14's hash
            # included); a struct sequence's own basic size counts its hidden fields too.
            address = id(sys.flags) + tuple.__basicsize__ + index * ctypes.sizeof(ctypes.c_void_p)
            slot = ctypes.c_void_p.from_address(address)
            if slot.value != id(sys.flags.no_site) or sys.flags.no_site != 1:
                raise ValueError("sys.flags is not laid out as a tuple")
            self.slot, self._ctypes = slot, ctypes
        except Exception as error:
            self.problem = "this interpreter's sys.flags cannot be given the site flag (%s)" % error

    def clear(self):
        """In a worker: sys.flags.no_site is 0, as the worker's interpreter was started."""
        zero = 0
        self._ctypes.pythonapi.Py_IncRef(self._ctypes.py_object(zero))  # the slot's reference
        self.slot.value = id(zero)


def _add_site_paths():
    """sys.path as site.py makes it, without running what the start-up runs: the user's and
    the system's site folders and the folders their .pth files name, but no .pth `import`
    line, no sitecustomize, no usercustomize (each worker's own, after its fork)."""
    import site

    known = site.removeduppaths()
    site.venv(known)  # a virtual environment's prefix (and whether it sees the system's)
    folders = []
    if site.check_enableusersite():
        folders.append(site.getusersitepackages())
    folders.extend(site.getsitepackages())
    for folder in folders:
        if not os.path.isdir(folder) or folder in sys.path:
            continue
        sys.path.append(folder)
        try:
            names = sorted(n for n in os.listdir(folder) if n.endswith(".pth") and n[0] != ".")
        except OSError:
            continue
        for name in names:
            try:
                with open(os.path.join(folder, name), encoding="utf-8") as pth:
                    lines = pth.read().splitlines()
            except (OSError, UnicodeDecodeError):
                continue
            for line in lines:
                if not line.strip() or line.startswith(("#", "import ", "import\t")):
                    continue
                path = os.path.abspath(os.path.join(folder, line.rstrip()))
                if os.path.exists(path) and path not in sys.path:
                    sys.path.append(path)


_SITE_FLAG = _SiteFlag()
if _SITE_IN_WORKER:
    _add_site_paths()
try:  # ddprun's own probe, which a worker's sitecustomize imports: its import does nothing
    __import__("_ddprun_probe")
except Exception:  # the worker imports it (and says why it cannot) itself
    pass
_PRELOADED_NAMES = set()  # the modules preloaded by name (torch, --warm_preload's)
_PRELOADED_MODULES = set()  # and every module their imports imported

_SOCKET_FD = int(_STARTUP_FD)
_C_SOURCE_KEPT = None  # _c_source_in_tracebacks(), asked before the first fork
# _frameless.works(), asked before the first fork. Where the interpreter keeps `-c` code's source
# for its tracebacks (_C_SOURCE_KEPT: 3.14), a `-c` worker (--run_path's) still runs above the
# template's frames: PyRun_SimpleStringFlags would not keep it.
_FRAMELESS = False
_MAX_FDS = 64


class _Refuse(Exception):
    """This template must not fork again: the reason goes back to the agent."""


# --- Preparing: importing the framework ----------------------------------------------------


def _threads():
    """This process's threads, less those _ddprun_frameless started to fork (each ends once it
    has forked)."""
    tasks = {int(task) for task in os.listdir("/proc/self/task")}
    _frameless.own_threads &= tasks
    return len(tasks - _frameless.own_threads)


def _openblas_threads():
    """OpenBLAS's pool size when OpenBLAS is loaded, else 0. Its threads are safe across a
    fork: it stops them before one (pthread_atfork) and starts them again on use."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libopenblas" in line}
    except OSError:
        return 0
    import ctypes

    for path in sorted(paths):
        try:
            return int(ctypes.CDLL(path).openblas_get_num_threads())
        except (OSError, AttributeError):
            continue
    return 0


def _fork_problem(driver=True):
    """Why forking now would not give a worker an exec'd one's state, or None. `driver`: look
    for the CUDA driver too (only an import can load it: after each prepare)."""
    if _SITE_FLAG.problem:
        return _SITE_FLAG.problem
    threads = _threads()
    if threads > 1 and threads - 1 > max(_openblas_threads() - 1, 0):
        return "the template has %d threads after its imports (a fork keeps only one)" % threads
    problem = _checks.cuda_driver_problem(_checks.open_fds()) if driver else None
    if problem:
        return problem
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    try:
        if cuda is not None and cuda.is_initialized():
            return "an import initialized CUDA, which a forked process cannot use"
    except Exception:
        pass
    return None


class _Preloaded:
    """The modules this template imported for the workers, what their imports read, and the
    files they came from as they were (_ddprun_warm_checks says why each matters)."""

    def __init__(self):
        self.files = {}  # listed name -> its file (checked against the workers')
        self.fds = _checks.open_fds()  # the descriptors the template itself holds
        self.held_fds = []  # descriptors a preloaded module holds (libffi's library file)
        self.startup = _checks.StartupFiles(_STARTUP_FDS)
        self.snapshot = _checks.Snapshot()
        self.reads = _checks.EnvironmentReads(())
        self.problem = None  # set once: the template never forks again
        self.effects = {}  # what the imports themselves set in os.environ (None: removed)
        self.files_checked = (float("-inf"), None)  # (when, what changed) for a burst of forks

    def prepare(self, preload, lists, own_folders, varying=()):
        """Imports the `preload` modules (the framework: torch, and --warm_preload's) that are
        installed code, never from the program's `own_folders`, once each, in the environment
        the template was given; then reads the workers' `lists` (the probe's modules.txt) for
        the environments their own imports of what the template holds ran in, and imports the
        framework's own submodules they name (PyTorch 2.x imports most of itself, and sympy
        through it, lazily at the first DDP step), up to the first one a worker imported in
        another environment."""
        started = time.monotonic()
        roots = _ddprun_modules.installed_roots()
        own = [os.path.realpath(f) for f in own_folders if f]
        self.reads.varying.update(varying)
        out_before = _output_sizes()
        counts = [0, 0]  # imported, failed
        for name in preload:
            self._preload(name, "", roots, own, counts)
            if name in self.files:
                _PRELOADED_NAMES.add(name)
        triples = _ddprun_modules.read_lists(lists, self.effects)
        if self.problem is None:
            self.problem = self._environment_problem(triples)
        if self.problem is None:
            for name, file, delta in triples:
                if self.problem or not self._framework_submodule(name):
                    continue
                if delta == _ddprun_modules.DIVERGENT or _changed_from_template(delta, self.effects):
                    break  # this one and those after it are the workers' own to import
                self._preload(name, file, roots, own, counts)
        self.snapshot.add_modules()
        if self.problem is None:
            self.problem = self._import_problem(out_before)
        return {_contract.OP: _contract.PREPARED, "imported": counts[0], "failed": counts[1],
                "modules": len(sys.modules), "seconds": round(time.monotonic() - started, 3),
                "problem": self.problem}

    @staticmethod
    def _framework_submodule(name):
        return name not in sys.modules and any(
            name.startswith(root + ".") for root in _PRELOADED_NAMES)

    def _preload(self, name, file, roots, own, counts):
        """Imports `name` (loaded from `file`, "" when not known yet) if it is installed code."""
        if self.problem or name in sys.modules:
            return
        import importlib
        import importlib.util

        if not file:
            try:
                spec = importlib.util.find_spec(name)
                file = spec.origin if spec is not None and spec.origin else ""
            except (ImportError, ValueError):
                file = ""
        if not file or not _ddprun_modules.installed(name, file, roots, own):
            counts[1] += 1  # not there, or the program's own: the workers import it
            return
        before = set(sys.modules)
        if self._import(importlib, name):
            counts[0] += 1
            self._remember(name, sys.modules.get(name), file)
            _PRELOADED_MODULES.update(set(sys.modules) - before)
        else:
            counts[1] += 1

    def _environment_problem(self, triples):
        """Why a worker forked from this template would not import what it preloaded as the
        workers did, or None: a program that changed its environment before `import torch`
        (OMP_NUM_THREADS set at its top, per rank, from the restart count) had that import read
        the changed value; the template's read the node's. What counts is the environment when
        the workers first imported each module preloaded by name (a change the program made
        before importing another of the framework's modules, numpy say, is still there then);
        the framework's own imports change it only after that. `triples`: read_lists' of the
        workers' modules lists."""
        for name, _, delta in triples:
            if name not in self.files:
                continue
            if delta == _ddprun_modules.DIVERGENT:
                return ("the ranks imported %s after setting their environments differently (a "
                        "variable per rank before the import), which the template imported once "
                        "in the node's" % name)
            key = _changed_from_template(delta, self.effects)
            if key:
                return ("the program sets %s (to %s) before it imports %s, which the template "
                        "imported with %s %s" % (key, _shown(delta[key]), name, key,
                                                 _shown(_STARTUP_ENV.get(key))))
        return None

    def _import(self, importlib, name):
        """Imports `name`, noting what it reads; False when it failed (not preloaded)."""
        before = dict(os.environ)
        self.reads.start(name, {})
        try:
            importlib.import_module(name)
            return True
        except BaseException:  # SystemExit, or anything: not preloaded
            sys.modules.pop(name, None)
            return False
        finally:
            self.reads.stop()
            self.effects.update(_checks.changes(before, dict(os.environ)))
            if self.reads.tainted and self.problem is None:
                variable, reader = self.reads.tainted
                self.problem = "%s reads %s at import, which differs between workers" % (
                    reader, variable)

    def _remember(self, name, module, file):
        path = getattr(module, "__file__", None)
        if not isinstance(path, str):
            return
        if file and os.path.realpath(path) != os.path.realpath(file):
            self.problem = self.problem or (
                "%s loaded from %s here, from %s in the workers" % (name, path, file))
        self.files[name] = path

    def _import_problem(self, out_before):
        if _output_sizes() != out_before:
            return "an import printed to the template's output (a worker's own import prints it)"
        self.held_fds = [fd for fd in _checks.open_fds() if fd not in self.fds]
        for fd in self.held_fds:
            if not _checks.read_only_file(fd):
                return "an import left descriptor %d open (%s), not a file read only" % (
                    fd, _checks.link(fd))
        return _fork_problem()

    def fork_problem(self, request):
        """Why a worker forked for `request` now would not be an exec'd one, or None; raises
        _Refuse when no worker of this template's would be."""
        if self.problem:
            raise _Refuse(self.problem)
        problem = self._files_changed() or _fork_problem(driver=False)
        if problem:
            return problem
        clash = [fd for fd in self.held_fds if fd in request["fds"]]
        if clash:
            return "a preloaded module holds descriptor %d (%s), the worker's %s" % (
                clash[0], _checks.link(clash[0]), "stdout or stderr" if clash[0] < 3 else "record")
        problem = self.startup.problem(request["fds"])
        if problem:
            return problem
        worker_env = _changed(request["env"], _entries(request["given"]), _STARTUP_ENV)
        differs = self.reads.differs(worker_env)
        if differs:
            variable, module, entry, here, there = differs
            raise _Refuse("%s read %s at import: %s in the template, %s in this worker" % (
                module, variable, _shown(here), _shown(there)))
        if request.get("blind"):
            return _program_problem(request)
        return None


    def _files_changed(self):
        """What changed on disk (every module the template holds, the .pth files), looked at
        once for a round's workers, forked a few ms apart: a stat of each module's file (about
        1,000-2,000 of them) costs ms that a restart's forks should not each pay, and a file
        changed between two of them could as well have changed between two exec'd workers'
        starts. (`snapshot.changed()` again after FILES_FRESH seconds.)"""
        now = time.monotonic()
        if now - self.files_checked[0] > FILES_FRESH:
            self.files_checked = (now, self.snapshot.changed())
        return self.files_checked[1]


# How long one look at the files stands for the forks that follow it.
FILES_FRESH = 1.0


def _changed_from_template(delta, effects):
    """The first variable of a worker's environment change (a list's delta) whose value the
    template's imports did not see (neither the node's nor what those imports set, `effects`),
    or None."""
    for key, value in sorted(delta.items()):
        if (effects[key] if key in effects else _STARTUP_ENV.get(key)) != value:
            return key
    return None


def _shown(value):
    return "unset" if value is None else repr(value)


_PROGRAMS = {}  # (path, source) -> why a blind fork must not run it, or None


def _program_problem(request):
    """--warm_start=always's first attempt: nobody has seen the program import yet, so a
    program that sets its own environment (before `import torch`, say) starts cold."""
    path, source = _checks.program_source(request["argv"], request["cwd"])
    if source is None:
        return "the program's source cannot be read to see whether it sets its environment"
    key = (path, source)
    if key not in _PROGRAMS:
        line = _checks.writes_environment(source, path)
        _PROGRAMS[key] = (
            None if line == 0 else
            "%s cannot be parsed to see whether it sets its environment: its first attempt "
            "starts cold" % path if line < 0 else
            "%s sets an environment variable (line %d), which may change what an import does: "
            "its first attempt starts cold" % (path, line))
    return _PROGRAMS[key]


def _output_sizes():
    """The template's stdout and stderr go to files of the agent's (their sizes tell whether
    an import printed)."""
    sizes = []
    for fd in (1, 2):
        try:
            sizes.append(os.fstat(fd).st_size)
        except OSError:
            sizes.append(-1)
    sys.stdout.flush()
    sys.stderr.flush()
    return sizes


# --- Forking a worker ---------------------------------------------------------------------


def _program_at(argv):
    """Where the program starts in `python [flags] PROGRAM ...`: the index of -c, -m or the
    script, past the interpreter's flags (this template runs with the same)."""
    at = 1
    while at < len(argv) and argv[at].startswith("-") and argv[at] not in ("-c", "-m"):
        at += 1
    return at


def _runs_source(argv):
    """Whether argv is `python [flags] -c SOURCE ...`."""
    at = _program_at(argv)
    return at < len(argv) and argv[at] == "-c"


def _spawn(request, fds, preloaded, control):
    """Forks the worker: its pid in the template, a _Job in the worker."""
    problem = preloaded.fork_problem(request)
    if problem:
        raise _Refuse(problem)
    pid_read, pid_write = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()

    def in_middle():
        """The middle child: forks the worker, and returns its _Job there. Its own session
        first, so that the worker is never in the template's process group, which the agent
        may kill as soon as it has the worker's pid (the worker makes its own session)."""
        try:
            os.close(pid_read)
            os.setsid()
            worker = os.fork()
        except BaseException:
            os._exit(1)
        if worker == 0:
            os.close(pid_write)
            return _become_worker(request, fds, control,
                                  preloaded.held_fds + preloaded.startup.open(), preloaded.effects)
        try:
            os.write(pid_write, struct.pack("i", worker))
        finally:
            os._exit(0)  # the worker is re-parented to the agent now

    if _FRAMELESS and not (_C_SOURCE_KEPT and _runs_source(request["argv"])):
        # The worker runs its program on the thread that forked it.
        try:
            middle = _frameless.run(in_middle)
        except OSError:
            middle = -1
    else:
        middle = os.fork()
        if middle == 0:
            return in_middle()
    os.close(pid_write)
    if middle < 0:
        os.close(pid_read)
        raise _Refuse("the template's fork failed")
    os.waitpid(middle, 0)
    data = os.read(pid_read, 4)
    os.close(pid_read)
    if len(data) != 4:
        raise _Refuse("the template's fork failed")
    return struct.unpack("i", data)[0]


def _become_worker(request, fds, control, held, effects):
    """In the forked worker: everything an exec'd worker would have, then its _Job. `effects`:
    what the preloaded imports set in os.environ (a worker's own imports would have)."""
    try:
        os.setsid()
        guard = request.get("guard", -1)
        if guard >= 0:  # the agent's group guard: a kill -9 of the agent takes this group
            _announce_group(fds[guard])
        _wait_for_agent_parent(request["agent"])
        _set_parent_death_signal()
        if os.getppid() != request["agent"]:
            os._exit(128 + signal.SIGKILL)  # the agent died meanwhile
        control.detach()
        _place_descriptors(request["fds"], fds, held)
        if request.get("cpus"):
            os.sched_setaffinity(0, request["cpus"])
        _reset_signals()
        exec_env = _set_environment(request["env"], request["given"])
        _checks.apply_effects(effects)
        os.chdir(request["cwd"])
        job = _Job(request["argv"])
        _checks.set_process_strings(job.argv, exec_env)
        _make_standard_streams()
        _reseed()
        _restart_clocks_and_keys()
        cold = _run_site()
        if cold:
            _exec_cold(request, cold)
        _start_probe()  # what ddprun's sitecustomize does last in an exec'd worker
        sys.path.insert(0, job.path0)
        return job
    except BaseException as error:
        try:
            os.write(2, ("ddprun: the warm template could not start this worker: %s: %s\n"
                         % (type(error).__name__, error)).encode())
        finally:
            os._exit(1)


def _announce_group(fd):
    with socket.socket(fileno=os.dup(fd)) as channel:
        try:
            channel.send(struct.pack("i", os.getpid()), socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL)
        except OSError:
            pass  # best effort, as the exec'd worker's: the agent tells the guard too


def _wait_for_agent_parent(agent):
    """Until the middle child has exited and this process is the agent's child. Its pidfd is
    readable once it has handed its children over (its descriptors close earlier: a pipe's EOF
    would come too soon)."""
    parent = os.getppid()
    if parent == agent:
        return
    try:
        fd = os.pidfd_open(parent)  # Python 3.9+
    except AttributeError:
        while os.getppid() == parent:  # an older Python: the middle child exits at once
            time.sleep(0.001)
        return
    except OSError:
        return  # gone already
    try:
        import select

        poller = select.poll()
        poller.register(fd, select.POLLIN)
        poller.poll(10000)  # the middle child exits at once
    finally:
        os.close(fd)


def _set_parent_death_signal():
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    PR_SET_PDEATHSIG = 1
    if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")


def _place_descriptors(targets, fds, held):
    """Leaves open exactly 0, 1, 2 and the inherited descriptors, at the numbers the agent
    gave them (inheritable, as exec leaves them), and those the preloaded modules hold (`held`,
    as a worker that imported them would); every other one the template had is closed."""
    floor = max([3, _MAX_FDS] + list(targets) + fds + held) + 1
    import fcntl

    high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, floor) for fd in fds]
    keep = set(high) | set(held) | {0}
    for fd in _checks.open_fds():
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass
    for target, fd in zip(targets, high):
        os.dup2(fd, target, inheritable=True)
    for fd in high:
        os.close(fd)


def _reset_signals():
    for number, handler in _SIGNALS.items():
        try:
            if handler is not None and signal.getsignal(number) is not handler:
                signal.signal(number, handler)
        except (OSError, ValueError, TypeError):
            pass
    signal.pthread_sigmask(signal.SIG_SETMASK, _MASK)


def _entries(entries):
    env = {}
    for entry in entries:
        key, _, value = entry.partition("=")
        env.setdefault(key, value)
    return env


def _changed(entries, given, after):
    """The environment `entries` with the changes that turned `given` into `after`."""
    env = _entries(entries)
    for key, value in given.items():
        if key not in after and env.get(key) == value:
            del env[key]
    for key, value in after.items():
        if given.get(key) != value:
            env[key] = value
    return env


def _set_environment(entries, given):
    """The worker's environment (`entries`, as ddprun would exec it) with the changes made to
    this template's (`given`, as ddprun started it) by a wrapper of the interpreter and by the
    interpreter's start-up (sitecustomize giving PYTHONPATH back): what the worker's own would
    have made. Returns the environment its exec would have had (/proc/PID/environ)."""
    given = _entries(given)
    os.environ.clear()
    os.environ.update(_changed(entries, given, _STARTUP_ENV))
    return _changed(entries, given, _EXEC_ENV)


def _stream(fd, write, name):
    """sys.stdin/stdout/stderr as Python's start-up makes them (create_stdio), keeping the
    encoding and errors this interpreter chose at start (same locale, same variables)."""
    try:
        os.fstat(fd)
    except OSError:
        return None
    old = {0: sys.__stdin__, 1: sys.__stdout__, 2: sys.__stderr__}[fd]
    # -u (or PYTHONUNBUFFERED) made every standard stream write through.
    buffered = sys.__stdout__ is None or not sys.__stdout__.write_through
    buffering = 0 if (not buffered and write) else -1
    buf = io.open(fd, "wb" if write else "rb", buffering, closefd=False)
    raw = buf.raw if buffering else buf
    raw.name = name
    line_buffering = buffered and (raw.isatty() or fd == 2)
    text = io.TextIOWrapper(buf, old.encoding if old else None, old.errors if old else None,
                            "\n", line_buffering, not buffered)
    text.mode = "w" if write else "r"
    return text


def _make_standard_streams():
    sys.stdin = sys.__stdin__ = _stream(0, False, "<stdin>")
    sys.stdout = sys.__stdout__ = _stream(1, True, "<stdout>")
    sys.stderr = sys.__stderr__ = _stream(2, True, "<stderr>")


def _reseed():
    """What a process seeds once from the system's entropy, at import, is seeded again here,
    as a fresh import would have: numpy's global RandomState and torch's default CPU
    generator. (torch seeds CUDA's generators with a fixed value when CUDA starts, in a fresh
    process as in this one: left alone.)"""
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        try:
            numpy_random.seed()
        except Exception:
            pass
    torch = sys.modules.get("torch")
    generator = getattr(torch, "default_generator", None)
    if generator is not None:
        try:
            generator.seed()
        except Exception:
            pass


def _restart_clocks_and_keys():
    """What a module set at import from the clock or the system's entropy for this process
    alone, set again as a fresh import would: logging's start time (relativeCreated counts
    from it) and multiprocessing's authkey (one per process tree, not per template)."""
    logging = sys.modules.get("logging")
    if logging is not None and hasattr(logging, "_startTime"):
        logging._startTime = (time.time_ns() if isinstance(logging._startTime, int)
                              else time.time())
    process = sys.modules.get("multiprocessing.process")
    current = getattr(process, "_current_process", None)
    if current is not None:
        try:
            current.authkey = os.urandom(32)
        except Exception:
            pass


def _run_site():
    """The worker's site start-up, as an exec'd interpreter runs it before the program: site.py
    imported anew with sys.path as the interpreter made it, so that it adds the site folders,
    runs the .pth files, sitecustomize (ddprun's, which installs the probe and runs the
    user's) and usercustomize, in this worker's environment, with its sys.argv. sys.flags
    says the start-up ran, as it does in an exec'd worker (its children get no -S).

    In an exec'd worker that start-up runs before torch is imported, here after: returns why
    that would differ (the worker must start cold), or None. It differs when the start-up set a
    variable (torch's import may read it, from C) or installed an import hook (a finder that
    patches torch as it imports: the preloaded torch never went through it)."""
    if not _SITE_IN_WORKER:
        return None
    _SITE_FLAG.clear()
    sys.path[:] = _BASE_PATH
    sys.modules.pop("site", None)
    finders = list(sys.meta_path)
    environment = dict(os.environ)
    probe = sys.modules.get("_ddprun_probe")
    if probe is not None:  # installed below, once the worker is known to stay forked
        probe.install_after_site = True
    import importlib

    importlib.import_module("site")
    if probe is not None:
        probe.install_after_site = False
    changed = sorted(key for key in _checks.changes(environment, dict(os.environ))
                     if key != "PYTHONPATH" and not key.startswith("DDPRUN_"))
    if changed:
        return "its site start-up (a .pth file or sitecustomize) sets %s, which %s's import " \
               "may read" % (changed[0], _preloaded_names())
    for finder in sys.meta_path:
        if not any(finder is before for before in finders) and not _harmless(finder):
            kind = type(finder) if not isinstance(finder, type) else finder
            return "its site start-up installed an import hook (%s.%s) that the preloaded %s " \
                   "never went through" % (kind.__module__, kind.__qualname__,
                                           _preloaded_names())
    return None


# Import hooks the site start-up installs that are known to find only the modules named here
# (setuptools' distutils shim; pip install -e's finders, by their MAPPING): harmless unless the
# template preloaded one of those.
_KNOWN_FINDERS = {"_distutils_hack": ("distutils", "pip")}


def _harmless(finder):
    module = getattr(type(finder) if not isinstance(finder, type) else finder, "__module__", "")
    module = module or ""
    if module.startswith("_ddprun_"):
        return True  # the probe's (its module watch finds nothing)
    names = _KNOWN_FINDERS.get(module)
    if names is None and module.startswith("__editable__"):
        names = tuple(getattr(sys.modules.get(module), "MAPPING", {}) or ()) or None
    if names is None:
        return False
    return not any(name in _PRELOADED_MODULES for name in names)


def _preloaded_names():
    return ", ".join(sorted(_PRELOADED_NAMES)) or "nothing"


def _exec_cold(request, why):
    """This worker becomes the exec'd one ddprun would have started: same pid, descriptors,
    session and parent; saying why in one line."""
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
        os.write(2, ("ddprun: warm start: this worker starts cold: %s\n" % why).encode())
        os.execve(request["program"], request["argv"], _entries(request["env"]))
    except BaseException as error:
        os.write(2, ("ddprun: the warm template could not start this worker cold: %s: %s\n"
                     % (type(error).__name__, error)).encode())
    os._exit(1)


def _start_probe():
    """ddprun's probe for this worker, as its sitecustomize would install it."""
    probe = sys.modules.get("_ddprun_probe")
    if probe is None or os.environ.get(_contract.PYTHON_PROBE) == "0":
        return  # (a probe that cannot be imported: the sitecustomize said so)
    try:
        probe.install()
    except Exception as error:
        reason = " ".join(("%s: %s" % (type(error).__name__, error)).split())
        sys.stderr.write("ddprun: the Python probe is off in this worker: %s\n" % reason)


def _c_source_in_tracebacks():
    """Whether this interpreter keeps `-c` code's source for its tracebacks (3.14 does; 3.11
    does not): asked once of the interpreter itself."""
    import linecache
    import subprocess

    if not hasattr(linecache, "_register_code"):
        return False
    try:
        probe = subprocess.run(
            [sys.executable, "-I", "-c", "import linecache; print(len(linecache._interactive_cache))"],
            capture_output=True, text=True, timeout=30)
        return probe.stdout.strip() not in ("", "0")
    except (OSError, subprocess.SubprocessError):
        return False


class _Job:
    """What the worker runs: `python <flags> SCRIPT ARGS` or `python <flags> -c SOURCE ARGS`,
    as the agent would have exec'd it (argv is that command)."""

    def __init__(self, argv):
        at = _program_at(argv)
        # The real interpreter's command line, as exec'd (a wrapper's exec included).
        self.argv = _ORIG_PREFIX + argv[at:] if _ORIG_PREFIX else list(argv)
        if hasattr(sys, "orig_argv"):  # Python 3.10+
            sys.orig_argv = list(self.argv)
        self.module = None
        if at < len(argv) and argv[at] == "-m":
            # As Python's -m: sys.argv[0] is "-m" until runpy finds the module, sys.path[0]
            # the working directory, in full.
            self.module, self.source, self.file = argv[at + 1], None, None
            sys.argv[:] = ["-m"] + argv[at + 2:]
            self.path0 = os.getcwd()
        elif at < len(argv) and argv[at] == "-c":
            self.source, self.file = argv[at + 1], None
            sys.argv[:] = ["-c"] + argv[at + 2:]
            self.path0 = ""
        else:
            # As CPython 3.9+: __main__.__file__ and the code's file name are absolute (a
            # program that changes directory still finds its source).
            self.file = os.path.abspath(argv[at])
            try:
                with open(self.file, "rb") as script:
                    self.source = script.read()
            except OSError as error:  # as Python says it, with its exit status
                sys.stderr.write("%s: can't open file %r: [Errno %d] %s\n" % (
                    argv[0], self.file, error.errno, error.strerror))
                sys.stderr.flush()
                os._exit(2)
            sys.argv[:] = argv[at:]  # as given
            self.path0 = os.path.dirname(os.path.realpath(self.file))

    def run(self):
        import builtins
        import importlib.machinery
        import types

        main = types.ModuleType("__main__")
        namespace = main.__dict__
        namespace["__builtins__"] = builtins
        for key in _MAIN_KEYS:
            namespace[key] = {}
        if self.module is not None:  # what Python's -m calls, with the same frames
            import runpy

            namespace["__loader__"] = importlib.machinery.BuiltinImporter
            sys.modules["__main__"] = main
            try:  # (_ddprun_frameless: the same, with no frame of this file's beneath)
                runpy._run_module_as_main(self.module, True)
            except SystemExit:
                raise
            except BaseException:
                sys.excepthook = _TrimmedHook(sys.excepthook)
                raise
            return
        if self.file is None:
            namespace["__loader__"] = importlib.machinery.BuiltinImporter
            code = compile(self.source, "<string>", "exec", dont_inherit=True)
            if _C_SOURCE_KEPT:  # as this interpreter's -c: tracebacks show the lines
                import linecache

                linecache._register_code(code, self.source, "<string>")
        else:
            namespace["__file__"] = self.file
            namespace["__cached__"] = None
            namespace["__loader__"] = importlib.machinery.SourceFileLoader("__main__", self.file)
            code = compile(self.source, self.file, "exec", dont_inherit=True)
        sys.modules["__main__"] = main
        del self.source
        try:
            exec(code, namespace)
        except SystemExit:
            raise
        except BaseException:
            sys.excepthook = _TrimmedHook(sys.excepthook)
            raise


    def prepare_main(self):
        """A fresh __main__ in sys.modules, as the interpreter's start-up leaves it for the
        C entry point that runs the program (_ddprun_frameless): __file__ and the loader of a
        script are PyRun_SimpleFileExFlags's to set, and to take away at the end."""
        import builtins
        import importlib.machinery
        import types

        main = types.ModuleType("__main__")
        namespace = main.__dict__
        namespace["__builtins__"] = builtins
        for key in _MAIN_KEYS:
            namespace[key] = {}
        if self.file is None:
            namespace["__loader__"] = importlib.machinery.BuiltinImporter
        if self.file is None and self.module is None:  # -c SOURCE, as the interpreter's
            self.source_bytes = self.source.encode("utf-8", "surrogateescape")  # UTF-8
        self.source = None
        sys.modules["__main__"] = main


class _TrimmedHook:
    """Prints an exception the entrypoint raised without this file's frames above it, as a
    fresh interpreter's traceback begins at the script, then gives sys.excepthook back."""

    def __init__(self, hook):
        self.hook = hook

    def __call__(self, kind, value, tb):
        while tb is not None and tb.tb_frame.f_code.co_filename == _FILE:
            tb = tb.tb_next
        if value is not None:
            value.__traceback__ = tb
        sys.excepthook = self.hook
        self.hook(kind, value, tb)


# --- Handing the worker its pages ------------------------------------------------------------

# After a fork the worker shares every page of the template's until one of them writes it. Each
# first write by the worker is then a copy-on-write fault, and once the worker runs threads
# (Gloo's, OpenMP's) each such fault also flushes the other CPUs' TLBs. Its first full
# gc.collect() writes to every page that holds a tracked object: 0.12 s forked against 0.04 s
# cold on PyTorch 1.13, the same again at its exit (docs/benchmarks.md, "In-place recovery").
# The template, single-threaded, takes the copies itself instead: it write-faults every resident
# page of its anonymous private mappings (MADV_POPULATE_WRITE, Linux 5.14), so the worker is
# left the only owner of the originals, and its own writes need no copy and no flush. The worker
# sees nothing of it. It costs the template about 0.05 s and its resident pages' worth of memory
# (which a cold worker would have used).
_MADV_POPULATE_WRITE = 23
_EINVAL = 22  # Linux's (the errno module is not imported here: a cold worker may not have it)
_PAGE = os.sysconf("SC_PAGE_SIZE")
_CHUNK_PAGES = 1 << 14  # pages asked of mincore() at once; the agent's socket is checked between
_give_pages_off = False  # the kernel cannot (before 5.14)


def _memory_calls():
    import ctypes  # imported with _ddprun_frameless already

    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    return libc, ctypes


def _anonymous_writable():
    """(start, end) of each private writable anonymous mapping: the heap, the stacks, mmap'd
    arenas. Not a file's pages (a library's data, never written, stays the file's)."""
    try:
        with open("/proc/self/maps") as maps:
            lines = maps.read().splitlines()
    except OSError:
        return []
    ranges = []
    for line in lines:
        fields = line.split(None, 5)
        if len(fields) < 5 or fields[1] != "rw-p":
            continue
        name = fields[5].strip() if len(fields) > 5 else ""
        if name and name not in ("[heap]", "[stack]") and not name.startswith("[anon"):
            continue
        start, end = (int(x, 16) for x in fields[0].split("-"))
        ranges.append((start, end))
    return ranges


def _asked(control):
    """Whether the agent has sent something (or closed the socket)."""
    try:
        return control.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) is not None
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return True


def _give_pages(control):
    """Copies the resident pages the last forked worker shares with the template (above), until
    the agent asks something: a worker it forks next shares them again and gets this again."""
    global _give_pages_off
    if _give_pages_off:
        return
    libc, ctypes = _memory_calls()
    for start, end in _anonymous_writable():
        for chunk in range(start, end, _CHUNK_PAGES * _PAGE):
            if _asked(control):
                return
            length = min(end, chunk + _CHUNK_PAGES * _PAGE) - chunk
            pages = length // _PAGE
            resident = (ctypes.c_ubyte * pages)()
            if libc.mincore(chunk, length, resident) != 0:
                break  # gone since /proc/self/maps was read
            flags = bytes(resident)
            first = flags.find(1)
            while first >= 0:
                last = flags.find(0, first)
                last = pages if last < 0 else last
                if libc.madvise(chunk + first * _PAGE, (last - first) * _PAGE,
                                _MADV_POPULATE_WRITE) != 0:
                    if ctypes.get_errno() == _EINVAL:
                        _give_pages_off = True  # not this kernel
                        return
                    break  # not these pages (a device's, say): the next chunk is tried
                first = flags.find(1, last)


# --- The loop -----------------------------------------------------------------------------


def _reply(control, message):
    control.send(json.dumps(message).encode())


def _serve():
    """Answers the agent until it closes the socket: None in the template, the worker's _Job
    in a forked worker."""
    global _C_SOURCE_KEPT, _FRAMELESS, _give_pages_off
    _C_SOURCE_KEPT = _c_source_in_tracebacks()
    _FRAMELESS = _frameless.works()
    sys.stderr.write("ddprun warm template: workers run %s\n" % (
        ("with no frame of the template's beneath" +
         (" (-c workers above them: this interpreter keeps -c code's source)"
          if _C_SOURCE_KEPT else "")) if _FRAMELESS else
        "above the template's frames (this interpreter cannot finalize a child forked from a "
        "thread)"))
    control = socket.socket(fileno=_SOCKET_FD)
    preloaded = _Preloaded()
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(control, 1 << 20, _MAX_FDS)
        except InterruptedError:
            continue
        if not data:
            return None
        give = False
        try:
            request = json.loads(data)
            if request[_contract.OP] == _contract.PREPARE:
                reply = preloaded.prepare(request.get("preload", []), request.get("lists", []),
                                          request.get("own", []), request.get("varying", []))
                _reply(control, reply)
                sys.stderr.write("ddprun warm template: prepared: %d modules imported (%d failed) "
                                 "in %.3f s, %d in all; problem: %s\n" % (
                                     reply["imported"], reply["failed"], reply["seconds"],
                                     reply["modules"], reply["problem"]))
            elif request[_contract.OP] == _contract.SPAWN:
                job = _spawn(request, fds, preloaded, control)
                if isinstance(job, _Job):
                    return job  # in the worker: its descriptors are placed
                _reply(control, {_contract.OP: _contract.SPAWNED, "pid": job})
                give = True
        except _Refuse as refused:
            _reply(control, {_contract.OP: _contract.COLD, "reason": str(refused)})
        except Exception as error:
            _reply(control, {_contract.OP: _contract.COLD,
                            "reason": "%s: %s" % (type(error).__name__, error)})
        for fd in fds:  # the worker's, which it has now
            os.close(fd)
        if give:
            try:
                _give_pages(control)
            except Exception:  # an optimisation only: never the template's end
                _give_pages_off = True


_job = _serve()
if _job is not None:
    del _serve, _spawn
    _job.run()
