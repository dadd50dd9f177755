"""What ddprun's warm template (_ddprun_template.py) checks so that a forked worker is an exec'd
one: the rule is that the template preloads only the framework (torch, --warm_preload's), whose
import it can show a cold one would have made the same, and refuses to fork (the agent starts
the worker cold, saying why) when it cannot.

State computed at import comes from things that may differ in a worker; each has its check here
(the environment the program set before `import torch` is the template's own check, against
the workers' modules lists):
- a rank's own variables (RANK, TORCHELASTIC_RESTART_COUNT...) read at import: every variable
  an import reads through os.environ is noted with the value it saw (EnvironmentReads); one the
  agent says differs between workers makes the template unusable, and any other is compared
  with the worker's before each fork;
- what an import itself sets in os.environ (torch._dynamo's TORCHINDUCTOR_CACHE_DIR): set in
  each forked worker too (changes, apply_effects);
- the descriptors the interpreter's start-up opened (a .pth line or sitecustomize that opens a
  log file): kept at their numbers when sharing them is the same as opening them again
  (StartupFiles), else no fork;
- files that changed: every module the template holds (not only those named in the lists),
  and the .pth files of the site folders (a `pip install -e` between attempts) (Snapshot);
- the CUDA driver: loaded or opened by an import (torch.cuda.is_available() at import does
  it), the template never forks (cuda_driver_problem);
- the first attempt of --warm_start=always, whose modules lists do not exist yet: forked only
  when the program's own source writes no environment variable (writes_environment).
Also here: the worker's /proc/PID/cmdline and environ written over the template's
(set_process_strings).
"""

import os
import sys


class EnvironmentReads:
    """The variables the template's imports read through os.environ (os.getenv, environ.get,
    `in`, iteration), with the value each saw (None: unset) and the module that read it.
    Between start() and stop(), os.environ's class is a recording subclass; it is os._Environ
    again otherwise, and always in a worker."""

    def __init__(self, varying):
        self.varying = set(varying)  # variables that differ between the workers (the agent's)
        self.seen = {}  # variable -> (value, module that read it first, the listed module
        #                whose import that was)
        self.delta = {}  # the environment change the current import runs in
        self.entry = None  # the listed module being imported
        self.tainted = None  # (variable, module): a varying variable read at import
        self._environ = self._class = None  # os.environ while recording, and its own class
        reads = self

        class _Recording(os._Environ):
            def __getitem__(self, key):
                try:
                    value = os._Environ.__getitem__(self, key)
                except KeyError:
                    reads.note(key, None)
                    raise
                reads.note(key, value)
                return value

        self._recording = _Recording

    def start(self, entry, delta):
        self.entry = entry
        self.delta = delta
        if not isinstance(os.environ, os._Environ):
            return  # a program replaced it (a dict): nothing to record through
        self._environ, self._class = os.environ, os.environ.__class__
        os.environ.__class__ = self._recording

    def stop(self):
        """Gives the object back its class, whatever os.environ names now."""
        if self._class is not None:
            self._environ.__class__ = self._class
            self._environ = self._class = None

    def note(self, key, value):
        if key in self.delta or key in self.seen:
            return  # in the delta: the worker's import ran in the same value
        module = _importing_module()
        self.seen[key] = (value, module, self.entry)
        if key in self.varying and self.tainted is None:
            self.tainted = (key, module)

    def differs(self, worker_env):
        """The first read whose value the worker would not have seen: (variable, module, the
        listed module whose import read it, the template's value, the worker's), or None."""
        for key, (value, module, entry) in self.seen.items():
            if worker_env.get(key) != value:
                return key, module, entry, value, worker_env.get(key)
        return None


def _importing_module():
    """The name of the innermost module whose body is running (the one reading)."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_name != "<module>":
        frame = frame.f_back
    if frame is None:
        return "?"
    return str(frame.f_globals.get("__name__", "?"))


def changes(before, after):
    """What turned the environment `before` into `after`: variable -> value, None if removed."""
    changed = {key: value for key, value in after.items() if before.get(key) != value}
    changed.update((key, None) for key in before if key not in after)
    return changed


def apply_effects(effects):
    """In a forked worker: what the preloaded imports set in os.environ at import (PyTorch
    2.x's torch._dynamo sets TORCHINDUCTOR_CACHE_DIR), as the worker's own imports would have
    set it. (Not in /proc/PID/environ, as for an exec'd worker's own putenv.)"""
    for key, value in effects.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


# --- Files: the modules the template holds, the .pth files of the site folders -------------


def _site_folders():
    """The folders whose .pth files the interpreter's start-up reads."""
    if sys.flags.no_site:
        return []
    import site

    folders = []
    try:
        folders.extend(site.getsitepackages())
        if site.ENABLE_USER_SITE:
            folders.append(site.getusersitepackages())
    except Exception:  # an old virtualenv's site.py
        pass
    for entry in sys.path:
        if os.path.basename(entry.rstrip("/")) in ("site-packages", "dist-packages"):
            folders.append(entry)
    return sorted(set(folders))


def _pth_files():
    files = {}
    for folder in _site_folders():
        try:
            names = [n for n in os.listdir(folder) if n.endswith(".pth")]
        except OSError:
            continue
        for name in names:
            path = os.path.join(folder, name)
            try:
                st = os.stat(path)
                files[path] = (st.st_mtime_ns, st.st_size)
            except OSError:
                pass
    return files


class Snapshot:
    """Every module file the template holds and the site folders' .pth files, as they were."""

    def __init__(self):
        self.modules = {}  # module name -> (path, mtime_ns, size)
        self.pth = _pth_files()

    def add_modules(self):
        """Notes the files of the modules imported since the last call."""
        for name, module in list(sys.modules.items()):
            if name in self.modules or name == "__main__":
                continue
            path = getattr(module, "__file__", None) if module is not None else None
            if not isinstance(path, str):
                self.modules[name] = None
                continue
            try:
                st = os.stat(path)
                self.modules[name] = (path, st.st_mtime_ns, st.st_size)
            except OSError:
                self.modules[name] = None

    def changed(self):
        """What changed on disk since, or None."""
        for name, entry in self.modules.items():
            if entry is None:
                continue
            path, mtime, size = entry
            try:
                st = os.stat(path)
            except OSError:
                return "%s (%s) is gone" % (name, path)
            if st.st_mtime_ns != mtime or st.st_size != size:
                return "%s (%s) changed since the template imported it" % (name, path)
        now = _pth_files()
        if now != self.pth:
            added = sorted(set(now) - set(self.pth))
            removed = sorted(set(self.pth) - set(now))
            edited = sorted(p for p in now if p in self.pth and now[p] != self.pth[p])
            what = ("%s was added" % added[0] if added else
                    "%s was removed" % removed[0] if removed else "%s changed" % edited[0])
            return ("a path file of the interpreter's start-up changed since the template "
                    "started (%s): a worker's sys.path would differ" % what)
        return None


# --- Descriptors ------------------------------------------------------------------------------


def open_fds():
    """This process's open descriptors (not the one that listed them, closed by then)."""
    import fcntl

    fds = []
    for name in os.listdir("/proc/self/fd"):
        try:
            fcntl.fcntl(int(name), fcntl.F_GETFD)
            fds.append(int(name))
        except OSError:
            pass
    return sorted(fds)


def link(fd):
    """What /proc/self/fd shows for `fd` ("?" when closed)."""
    try:
        return os.readlink("/proc/self/fd/%d" % fd)
    except OSError:
        return "?"


def _kind(fd):
    """(st_mode, the open flags) of `fd`, or None when it is closed."""
    import fcntl

    try:
        return os.fstat(fd).st_mode, fcntl.fcntl(fd, fcntl.F_GETFL)
    except OSError:
        return None


def read_only_file(fd):
    """Whether fd is a regular file open for reading only: a library's file that a module
    keeps (libffi maps its trampolines from its own file), which a worker keeps too."""
    import stat

    kind = _kind(fd)
    return (kind is not None and stat.S_ISREG(kind[0])
            and (kind[1] & os.O_ACCMODE) == os.O_RDONLY)


def _same_when_shared(fd):
    """Whether a worker that shares `fd` with the template (and its siblings) sees what one
    that opened it again would: a file read only, a file appended to (every write lands at its
    end either way), a character device (/dev/null, a terminal)."""
    import stat

    kind = _kind(fd)
    if kind is None:
        return False
    if stat.S_ISCHR(kind[0]) or read_only_file(fd):
        return True
    return stat.S_ISREG(kind[0]) and bool(kind[1] & os.O_APPEND)


class StartupFiles:
    """The descriptors the interpreter's start-up opened before the template's code ran."""

    def __init__(self, fds):
        self.fds = list(fds)

    def open(self):
        return [fd for fd in self.fds if _kind(fd) is not None]

    def problem(self, targets):
        """Why a worker cannot keep them (their numbers are not free for it, or a shared one
        would not behave as its own), or None."""
        for fd in self.open():
            if fd in targets:
                return ("the interpreter's start-up opened descriptor %d (%s), which a worker "
                        "is given for ddprun's own use" % (fd, link(fd)))
            if not _same_when_shared(fd):
                return ("the interpreter's start-up opened descriptor %d (%s), which every "
                        "worker would open for itself (not a file read only or appended to)"
                        % (fd, link(fd)))
        return None


def cuda_driver_problem(fds):
    """Why the CUDA driver is in use here, judged by the driver itself (its library mapped, a
    /dev/nvidia* descriptor open), or None: a library that asks torch.cuda.is_available() at
    import initializes it without torch.cuda.is_initialized() saying so."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                if "/libcuda.so" in line:
                    return ("an import loaded the CUDA driver (%s), which a forked process "
                            "cannot use" % line.split()[-1])
    except OSError:
        pass
    for fd in fds:
        path = link(fd)
        if path.startswith("/dev/nvidia"):
            return "an import opened %s (the CUDA driver), which a forked process cannot use" % (
                path)
    return None


# --- The first attempt of --warm_start=always -------------------------------------------------


def _is_environ(node):
    import ast

    return ((isinstance(node, ast.Attribute) and node.attr == "environ")
            or (isinstance(node, ast.Name) and node.id == "environ"))


_WRITES = ("update", "setdefault", "pop", "popitem", "clear", "__setitem__", "__delitem__")


def writes_environment(source, filename):
    """The line of the first statement in `source` that writes an environment variable
    (os.environ[...] = ..., del os.environ[...], os.environ.update(...), os.putenv...), 0 when
    none does, -1 when it cannot be read. Conservative: anywhere in the file."""
    import ast

    try:
        tree = ast.parse(source, filename)
    except (SyntaxError, ValueError):
        return -1
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.Delete)):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in ("putenv", "unsetenv") or (
                    node.func.attr in _WRITES and _is_environ(node.func.value)):
                return node.lineno
            continue
        else:
            continue
        for target in targets:
            if isinstance(target, ast.Subscript) and _is_environ(target.value):
                return node.lineno
    return 0


def program_source(argv, cwd):
    """(path, source bytes) of the program a worker's command line runs: the script, or the
    -m module, or the --run_path script of ddprun's wrapper; (None, None) when it cannot be
    told."""
    at = 1
    while at < len(argv) and argv[at].startswith("-") and argv[at] not in ("-c", "-m"):
        at += 1
    if at >= len(argv):
        return None, None
    path = argv[at]
    if argv[at] == "-m":
        if at + 1 >= len(argv):
            return None, None
        base = os.path.join(cwd, *argv[at + 1].split("."))
        path = base + ".py" if os.path.isfile(base + ".py") else os.path.join(base, "__main__.py")
    elif argv[at] == "-c":
        mode, target = (argv[at + 2], argv[at + 3]) if len(argv) > at + 3 else (None, None)
        if mode == "--run_path":
            path = target
        elif mode == "-m":
            base = os.path.join(cwd, *target.split("."))
            path = base + ".py" if os.path.isfile(base + ".py") else os.path.join(
                base, "__main__.py")
        else:
            return "<string>", argv[at + 1].encode()
    path = os.path.join(cwd, path)
    try:
        with open(path, "rb") as script:
            return path, script.read()
    except OSError:
        return None, None


# --- /proc/PID/cmdline and environ ------------------------------------------------------------

PR_SET_MM = 35
PR_SET_MM_ARG_END = 2
PR_SET_MM_ENV_END = 3
PR_SET_MM_MAP = 14


def _stat_fields():
    """/proc/self/stat's fields; field N (man 5 proc, from 1) is at index N - 1."""
    with open("/proc/self/stat") as stat:
        text = stat.read()
    head, _, tail = text.rpartition(")")
    return [head] + ["name"] + tail.split()


class _Kernel:
    """libc's prctl and sbrk, loaded in the worker when it first needs them: not in the
    template, where a ctypes call may open libffi's own file (its trampolines), a descriptor
    the template would then count as its own and close in the worker under libffi."""

    def __init__(self):
        import ctypes

        self.ctypes = ctypes
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p,
                                    ctypes.c_ulong, ctypes.c_ulong]
        self.libc.sbrk.restype = ctypes.c_void_p
        self.libc.sbrk.argtypes = [ctypes.c_long]


_KERNEL = None


def _kernel():
    global _KERNEL
    if _KERNEL is None:
        _KERNEL = _Kernel()
    return _KERNEL


# struct prctl_mm_map (linux/prctl.h): 11 addresses, the auxv pointer, its size, exe_fd.
_MM_MAP = "=11QQII"


def _set_ends(fields, arg_end, env_end):
    """Moves the ends of this process's command line and environment areas, as the kernel
    shows them in /proc/PID/cmdline and environ: PR_SET_MM_MAP (the same map with the two ends
    changed; needs no capability), else PR_SET_MM_ARG_END/ENV_END (needs CAP_SYS_RESOURCE).
    False when the kernel refused both. `fields`: /proc/self/stat's."""
    import struct

    kernel = _kernel()
    libc, ctypes = kernel.libc, kernel.ctypes
    try:
        f = [int(v) for v in fields[25:51]]  # fields 26..51
    except ValueError:
        return False

    def field(n):
        return f[n - 26]

    brk = libc.sbrk(0) or field(47)
    mm = ctypes.create_string_buffer(struct.pack(
        _MM_MAP, field(26), field(27), field(45), field(46), field(47), brk, field(28),
        field(48), arg_end, field(50), env_end, 0, 0, 0xFFFFFFFF))
    if libc.prctl(PR_SET_MM, PR_SET_MM_MAP, ctypes.addressof(mm), struct.calcsize(_MM_MAP),
                  0) == 0:
        return True
    return (libc.prctl(PR_SET_MM, PR_SET_MM_ARG_END, arg_end, 0, 0) == 0
            and libc.prctl(PR_SET_MM, PR_SET_MM_ENV_END, env_end, 0, 0) == 0)


def _fill(start, data):
    _kernel().ctypes.memmove(start, data, len(data))


def set_process_strings(argv, env):
    """/proc/self/cmdline and /proc/self/environ (what ps, pgrep -f and pkill -f read) as an
    exec'd worker's, exactly: written over the template's, in the room ddprun padded them with
    (sized from the workers' command line), and the areas' ends moved after them. Where the
    kernel moves neither end (no PR_SET_MM_MAP, no CAP_SYS_RESOURCE), the command line is one
    string, the arguments joined by spaces, and NULs follow the environment. Left as they are
    when the worker's do not fit."""
    try:
        fields = _stat_fields()
        arg_start, arg_end, env_start, env_end = (int(v) for v in fields[47:51])
    except (OSError, ValueError, IndexError):
        return
    encoding = sys.getfilesystemencoding()
    command = b"".join(a.encode(encoding, "surrogateescape") + b"\0" for a in argv)
    environment = b"".join(("%s=%s" % item).encode(encoding, "surrogateescape") + b"\0"
                           for item in env.items())
    if arg_start <= 0 or len(command) > arg_end - arg_start:
        return
    if len(environment) > env_end - env_start:
        environment = b""  # the template's stays
    _fill(arg_start, command + b"\0" * (arg_end - arg_start - len(command)))
    if environment:
        _fill(env_start, environment + b"\0" * (env_end - env_start - len(environment)))
    new_env_end = env_start + len(environment) if environment else env_end
    if _set_ends(fields, arg_start + len(command), new_env_end):
        return
    # The kernel kept the ends: the command line as one string, spaces between the arguments,
    # which the kernel reads up to its first NUL once the area's last byte is not one (as
    # setproctitle does).
    text = command[:-1].replace(b"\0", b" ") + b"\0"
    size = arg_end - arg_start
    if len(text) < size:
        _fill(arg_start, text + b" " * (size - len(text)))
