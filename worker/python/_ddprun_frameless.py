"""Forks a warm worker so that no frame of ddprun's lies beneath its program (issue 36).

A frame cannot leave a thread's stack while it runs, so the worker is forked from a thread whose
stack has no Python frame: a thread started on a C callable (a deque consuming a map) that
calls, one by one, the steps a suspended generator yields. Only the step running is on the
stack; the program itself is run by CPython's own C entry points (PyRun_SimpleFileExFlags for a
script, PyRun_SimpleStringFlags for -c, as `python` does; runpy._run_module_as_main for -m), and
the worker ends in Py_Exit, as Py_RunMain does: threads joined, atexit, flushing, finalization,
the interpreter's exit status. After a fork CPython makes the forking thread the child's main
thread (signals, threading.main_thread()).

CPython 3.13 and later remember the main thread's state in _PyRuntime.main_tstate and never
update it after a fork, so a child forked from another thread crashes in Py_FinalizeEx (it
swaps in the state PyOS_AfterFork_Child deleted). The child points that word at its own
thread's state first (_adopt_main_thread_state): the one word of the runtime's head that held
the template's main thread state.

The template asks works() once, before its first fork: a child forked this way that runs an
atexit callback and exits 0. Where it does not, the template forks from its main thread as
before, and its frames stay beneath the program's.

Threading: run() is called on the template's main thread and returns in the template once the
middle child has been forked; everything after the fork runs on the forking thread alone.
"""

import _thread
import collections
import ctypes
import functools
import operator
import os
import sys
import warnings

_call = operator.methodcaller("__call__")  # item() from C: map(_call, steps)
_WORKS_TIMEOUT_MS = 10000  # works(): a child that has not exited by then does not work


def _api():
    """The C entry points, with their signatures."""
    api = ctypes.pythonapi
    api.PyRun_SimpleFileExFlags.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int,
                                            ctypes.c_void_p]
    api.PyRun_SimpleFileExFlags.restype = ctypes.c_int
    api.PyRun_SimpleStringFlags.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
    api.PyRun_SimpleStringFlags.restype = ctypes.c_int
    api.Py_Exit.argtypes = [ctypes.c_int]
    api.Py_Exit.restype = None
    libc = ctypes.CDLL(None, use_errno=True)
    libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    libc.fopen.restype = ctypes.c_void_p
    libc.on_exit.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    return api, libc


_API, _LIBC = _api()


_RUNTIME_WORDS = 2048  # how much of _PyRuntime's head is searched for main_tstate


def _main_thread_state():
    """(the _PyRuntime words, the calling thread's state): on the template's main thread, what
    _adopt_main_thread_state needs; None before 3.13 or where _PyRuntime is not exported."""
    if sys.version_info < (3, 13):
        return None
    try:
        api = ctypes.pythonapi
        api.PyThreadState_Get.restype = ctypes.c_void_p
        runtime = ctypes.addressof(ctypes.c_char.in_dll(api, "_PyRuntime"))
        return (ctypes.c_void_p * _RUNTIME_WORDS).from_address(runtime), api.PyThreadState_Get()
    except (AttributeError, ValueError):
        return None


def _adopt_main_thread_state(main):
    """In a child forked from a thread other than the main one: the runtime's main_tstate, the
    one word that still holds the main thread's (deleted) state, becomes this thread's, as if
    this thread had always been the main one. Left alone unless exactly one word matches."""
    if main is None:
        return
    words, old = main
    found = [i for i in range(_RUNTIME_WORDS) if words[i] == old]
    if len(found) == 1:
        words[found[0]] = ctypes.pythonapi.PyThreadState_Get()


def _fork(state):
    """os.fork() on the calling thread; state["pid"] is its result, or state["error"]."""
    try:
        with warnings.catch_warnings():  # 3.12+: "multi-threaded, use of fork()": the other
            warnings.simplefilter("ignore", DeprecationWarning)  # thread is the template's
            state["pid"] = os.fork()
    except BaseException as error:
        state["pid"], state["error"] = -1, error


def _exit_status(value):
    """What PyErr_Print makes of SystemExit(value.code): the status, having printed a
    message."""
    code = value.code
    if code is None:
        return 0
    if isinstance(code, int):
        return ctypes.c_int(code).value
    try:
        sys.stderr.write(str(code) + "\n")
        sys.stderr.flush()
    except Exception:
        pass
    return 1


def _exit_by_sigint():
    """As Py_RunMain after an uncaught KeyboardInterrupt in a script: once finalized, the
    process kills itself with SIGINT (default disposition). on_exit runs these C functions,
    last registered first, with (status, arg): signal(2, SIG_DFL), then raise(2)."""
    for name in ("raise", "signal"):
        _LIBC.on_exit(ctypes.cast(getattr(_LIBC, name), ctypes.c_void_p).value, None)
    return 2  # SIGINT


class _ModuleRun:
    """`python -m NAME`: runpy._run_module_as_main(NAME, True) from C, its error caught by C
    (a weakref's callback: PyErr_WriteUnraisable hands it to sys.unraisablehook, SystemExit
    too), so that no frame of ours is beneath runpy's."""

    def __init__(self, name):
        import runpy

        self.code = runpy._run_module_as_main.__code__
        self.run = functools.partial(runpy._run_module_as_main, name)  # (name, ref): alter_argv
        self.error = None
        self.hook = None
        self.ref = None

    def _ours(self, args):
        """Whether `args` is the module's own error: named by our callback (3.11), or raised
        through runpy's frame at the bottom of a stack (3.13 names no object)."""
        if args.object is self.run:
            return True
        tb = args.exc_traceback
        return tb is not None and tb.tb_frame.f_code is self.code and tb.tb_frame.f_back is None

    def _unraisable(self, args):
        if self.error is None and self._ours(args):
            self.error = args.exc_value
        else:
            self.hook(args)

    def steps(self):
        import weakref

        class _Trigger:
            pass

        holder = [_Trigger()]
        self.ref = weakref.ref(holder[0], self.run)
        self.hook = sys.unraisablehook
        sys.unraisablehook = self._unraisable
        yield functools.partial(holder.clear)  # the object dies: its callback runs the module
        if sys.unraisablehook == self._unraisable:
            sys.unraisablehook = self.hook
        error, self.error = self.error, None
        if error is None:
            yield functools.partial(_API.Py_Exit, 0)  # (Py_Exit does not return)
        if isinstance(error, SystemExit):
            yield functools.partial(_API.Py_Exit, _exit_status(error))
        # PyErr_Print's: sys.last_* set, then sys.excepthook, then exit status 1.
        sys.last_type, sys.last_value, sys.last_traceback = (
            type(error), error, error.__traceback__)
        if sys.version_info >= (3, 12):
            sys.last_exc = error
        yield functools.partial(sys.excepthook, type(error), error, error.__traceback__)
        yield functools.partial(_API.Py_Exit, 1)


def _program_steps(job, results):
    """The steps that run the worker's program `job` (its __main__ in sys.modules) and end
    the process as the interpreter would."""
    if job.module is not None:
        yield from _ModuleRun(job.module).steps()
        return
    for name in ("last_type", "last_value", "last_traceback", "last_exc"):
        if hasattr(sys, name):
            delattr(sys, name)
    if job.file is None:
        yield functools.partial(_API.PyRun_SimpleStringFlags, job.source_bytes, None)
    else:
        fp = _LIBC.fopen(os.fsencode(job.file), b"rb")
        if not fp:
            error = ctypes.get_errno()
            sys.stderr.write("%s: can't open file %r: [Errno %d] %s\n" % (
                job.argv[0], job.file, error, os.strerror(error)))
            sys.stderr.flush()
            yield functools.partial(_API.Py_Exit, 2)
        yield functools.partial(_API.PyRun_SimpleFileExFlags, fp, os.fsencode(job.file), 1,
                                None)
    if results[-1] == 0:
        yield functools.partial(_API.Py_Exit, 0)
    error = getattr(sys, "last_value", None)  # PyErr_Print's, for an uncaught exception
    if isinstance(error, KeyboardInterrupt):
        yield functools.partial(_API.Py_Exit, _exit_by_sigint())
    yield functools.partial(_API.Py_Exit, 1)


def _steps(state, become, lock):
    """Forks the middle child; in the template, lets the main thread go on. In the middle
    child, `become()` forks the worker, and returns its _Job there (None in the middle,
    which it ends)."""
    state["tid"] = _thread.get_native_id()
    yield functools.partial(_fork, state)
    if state["pid"] != 0:
        yield functools.partial(lock.release)
        return
    _adopt_main_thread_state(state["main"])
    job = become()
    if job is None:
        return
    job.prepare_main()
    yield from _program_steps(job, state["results"])


# The stack of the thread a worker is forked from, which becomes its main thread's: an exec'd
# worker's main thread grows its stack up to RLIMIT_STACK, as that limit is when it grows (a
# program may raise it, or run under `ulimit -s unlimited`); a thread's stack is mapped once.
# So the thread gets the most the main thread could reach: the hard limit (at most this much
# where it is unlimited; the soft limit where that is higher), address space only until used.
# Python 3.14 and later bound C recursion by the stack a thread had when it started (for the
# main thread: the soft limit at the interpreter's start, however the program raises it):
# there the thread gets the soft limit, and recursion fails where an exec'd worker's would.
_UNLIMITED_STACK_BYTES = 1 << 30


def main_stack_bytes():
    """The stack size for a worker's forking thread (above)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_STACK)
    cap = _UNLIMITED_STACK_BYTES
    size = cap if hard == resource.RLIM_INFINITY else min(hard, cap)
    if soft != resource.RLIM_INFINITY:
        size = soft if sys.version_info >= (3, 14) else max(size, soft)
    page = os.sysconf("SC_PAGE_SIZE")
    return max(size // page * page, 1 << 20)


# Native ids of the threads run() started: each ends right after its fork, and is no thread
# of the program's (the template's check for threads that a fork would lose skips them).
own_threads = set()


def run(become):
    """Forks the middle child from a frameless thread: its pid in the template (raises the
    fork's error). become() runs in it, as described in _steps."""
    state = {"results": [], "main": _main_thread_state()}
    lock = _thread.allocate_lock()
    lock.acquire()
    steps = map(state["results"].append, map(_call, _steps(state, become, lock)))
    was = _thread.stack_size(main_stack_bytes())
    try:
        _thread.start_new_thread(collections.deque, (steps, 0))
    finally:
        _thread.stack_size(was)
    lock.acquire()
    own_threads.add(state["tid"])
    if state.get("error") is not None:
        raise state["error"]
    return state["pid"]


def works():
    """Whether a child forked this way runs an atexit callback and exits 0 (see above)."""
    import select
    import signal

    class _Probe:
        module, file, argv = None, None, [sys.executable]
        source_bytes = b"import atexit, os\natexit.register(os.write, %d, b'ok')\n"

        def prepare_main(self):
            pass

    read, write = os.pipe()
    probe = _Probe()
    probe.source_bytes = probe.source_bytes % write

    def become():
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file where it crashes
        os.close(read)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        return probe

    try:
        pid = run(become)
    except OSError:
        return False
    finally:
        os.close(write)
    try:
        poller = select.poll()
        poller.register(read, select.POLLIN)
        if not poller.poll(_WORKS_TIMEOUT_MS):  # neither "ok" nor its end: stuck
            os.kill(pid, signal.SIGKILL)
        said = os.read(read, 2)
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(read)
    return os.waitstatus_to_exitcode(status) == 0 and said == b"ok"
