"""ddprun's Python probe: records a PyTorch worker's collectives and DDP steps in the agent's
record page, and registers the signal on which the worker dumps its Python stacks.

Loaded by sitecustomize.py (beside this file) at start-up. Costs nothing until torch.distributed
is imported, and never imports torch itself.

The contract with the agent (the page's layout is common/include/ddp/common/collective_record.hpp)
- DDPRUN_RECORD_FD: an inherited memfd of PAGE_BYTES bytes, zeroed. Unset, closed, or not a
  memfd (a process that inherited the environment but not the descriptor): the probe does
  nothing at all.
- DDPRUN_STACK_FD, DDPRUN_STACK_SIGNAL: on that signal faulthandler writes every thread's stack
  into that descriptor. Registered at start-up, so that it works before torch is imported; the
  page's stack_signal word is set once it is.
- The page is claimed (pid word 0 -> our pid) when the default process group is made, then
  published by writing magic last. A page another process claimed (libddp in this process, the
  worker that exec'd us with its descriptors) is left alone, and a forked child (DataLoader
  workers) never writes. On an internal error the probe unpublishes the page (magic 0) rather
  than leave a frozen record that would read as a hang.
- Each process group is numbered on its own: the default one in lane 0, each other group this
  rank is a member of in a free lane (up to 3), its context its c10d name + 1 (c10d names
  groups by a counter every rank advances, members or not), so the agent matches a group
  across ranks whatever lane it holds. Sends and receives are not numbered (a send meets one
  recv, ranks send unevenly): a thread blocked in one's wait is written to the lane's p2p
  words while it waits.
- NCCL groups are not recorded here: a NCCL Work's future completes at enqueue, which says
  nothing of a hang; a job whose default group is NCCL is left to ddprun's NCCL profiler
  plugin, which claims the page itself.
- Writes are 64-bit stores through a memoryview under one lock (future callbacks run on the
  backends' threads); each slot is a seqlock, as in the header. A thread never waits for the
  lock it holds: a Python signal handler that runs while its thread records and issues a
  collective leaves that one unrecorded (the lane's unrecorded word counts it).

What PyTorch lets us see, checked with two Gloo processes on 127.0.0.1:
- PyTorch 2.14 has ProcessGroup.register_pre_hook / register_post_hook(hook_id, hook); one id
  per group, registering it again replaces the hook. Both run on the issuing thread: pre right
  before the backend is called, post right after the backend returned its Work, before any
  wait, for a synchronous call (async_op False) as well as for an asynchronous one. So post is
  no completion: the Work's future is, and its done callbacks run on the Gloo thread (or at once
  when it already completed). op_id counts each group's calls from 0.
- A backend that raises at issue (an invalid root, mismatched sizes) runs pre and never post:
  such a record is closed, failed, when the thread issues its next collective.
- DDP's bucket all-reduces go through the hooks: one ALLREDUCE per bucket, async_op True, the
  flat bucket as input, issued from the autograd thread during backward in bucket order; so do
  its construction-time all_gather and broadcasts and, in step 2, the rebuilt buckets'
  broadcasts. The bucket index is not passed, so slots carry kNoBucket.
- Gloo's reduce_scatter, send and recv Works have no future (get_future raises "not
  implemented"). A Work that goes back to Python (every call of c10d's own functions: they
  wait() at once for a synchronous call and hand an asynchronous one's Work to the program) is
  finished when Python sees it complete: Work.wait, get_future and is_completed are wrapped,
  and the open Works are checked at the thread's next collective and at a DDP step's end.
  Only Works that C++ waits for (DDP's buckets and start-up calls) get a future callback,
  which costs a GIL hand-over to the backend's thread. monitored_barrier bypasses the hooks.
- input_tensors are what the rank sends, except for SCATTER (the root's whole list) and
  REDUCE_SCATTER (the whole input): the count is taken from output_tensors for those and RECV.
- A hook that raises raises into the user's call, so every hook here catches everything.
- A group never destroyed outlives Python (c10d's C++ registry) and destroying our hooks then
  aborts the process: they are unregistered at exit.
- Whatever the probe puts in place of PyTorch's callables (Work's methods, DDP's forward, the
  group makers, 1.13's collective functions) is made by around(): C code that calls the
  probe's Python before and after, so that no frame of ours is on the stack while PyTorch's
  call runs and the program's tracebacks are its own (docs/cli.md, "Where ddprun differs").
- torch.compile would trace the hooks (run from C++ inside compiled regions) and the forward
  wrapper: this module is put on dynamo's skip list once torch._dynamo is imported.
- PyTorch 1.13 has no such hooks: its Python collective functions are wrapped instead. Any
  exception from one marks it failed, the header too: an argument error looks like a broken
  communicator. As DDP's Reducer calls the backend from C++, each step's gradient reduction is
  recorded as one collective (Op 13) from the start to the end of backward. DDP's broadcast of
  the module's state (at construction, and of its buffers at each forward: BatchNorm) goes
  through torch.distributed._broadcast_coalesced, a C++ function wrapped as one BROADCAST.
- Both: a callback queued with the autograd engine's queue_callback from inside a final callback
  runs after DDP's own finalize callback, once the gradients are averaged: that is a step's end.
- 2.14's HookOpName has SPLIT and NEW_WINDOW, which are no collectives: not recorded.

Cost (scripts/bench-probe's per-collective figures in docs/benchmarks.md): a few us of CPU
per collective, synchronous or async_op=True. Start-up: about 1 ms, with this module's .pyc
cached.
"""

import _thread
import atexit
import faulthandler
import os
import sys
import time

import _ddprun_contract as _contract  # names only

# weakref, inspect and importlib are imported where torch is instrumented, not at start-up: the
# probe loads into every Python worker, torch or not (threading: _thread, for the same reason).

from _ddprun_record import (  # the page and its writer
    PID, COMPUTE_NS_TOTAL, WAIT_NS_TOTAL, STACK_SIGNAL, STACK_FD, NO_PEER,
    HASHED_CONTEXT, S_READY_NS, S_FINALIZED_NS, ALL_REDUCE, BROADCAST, ALL_GATHER, REDUCE_SCATTER,
    BARRIER, REDUCE, GATHER, SCATTER, ALL_TO_ALL, SEND, RECV, OTHER, GRADIENTS, pack_name,
    _map_page, Recorder)

# The modules list for ddprun's warm template, when ddprun asks for one: imported here, while
# sitecustomize still has this folder on sys.path (install() runs after it dropped it).
_ddprun_modules = None
if os.environ.get(_contract.MODULES_FILE):
    import _ddprun_modules

# --- What a tensor argument weighs ------------------------------------------------------------

_dtypes = {}  # torch.dtype -> (pack_name of its name: "float32", "bfloat16"..., element size)


def _dtype(tensor):
    known = _dtypes.get(tensor.dtype)
    if known is None:
        name = str(tensor.dtype).rpartition(".")[2]
        known = _dtypes[tensor.dtype] = (pack_name(name), tensor.element_size())
    return known


def _measure(tensors):
    """(dtype word, elements, bytes) of a tensor or a list of them (of one dtype, as every
    collective wants); zeros for none."""
    if tensors is None:
        return 0, 0, 0
    if not isinstance(tensors, (list, tuple)):
        dtype, size = _dtype(tensors)
        count = tensors.numel()
        return dtype, count, count * size
    if not tensors:
        return 0, 0, 0
    dtype, size = _dtype(tensors[0])
    count = 0
    for tensor in tensors:
        count += tensor.numel()
    return dtype, count, count * size


class _ThreadState(_thread._local):
    open_seq = 0  # 2.14: the collective between its pre and post hook on this thread
    open_lane = None  # its lane
    open_p2p = None  # 2.14: (lane, op, bytes, peer) of the send or recv between its hooks
    open_id = -1  # its op_id, in the group open_group stands for
    open_group = None  # a token of the group
    inside = False  # 1.13: inside a wrapped collective function (they call each other)
    last_step = None  # the _StepWatch of the last step this thread began


# --- Around PyTorch's calls ---------------------------------------------------------------------

_AROUND_FILE = "_ddprun_around.abi3.so"  # beside this file (worker/python_around)
_around_function = None  # what _around() found


def _around():
    """around(target, before, after): the callable the probe puts in place of one of PyTorch's.
    It calls token = before(args, kwargs); when token is not None, target(*args, **kwargs) and
    then after(token, result, failed) (result None when the call raised, and the exception goes
    on). Bound as a method when set on a class.

    The native one (_ddprun_around) leaves no frame of ours on the stack while target runs, so
    the program's tracebacks and stacks are its own. Loaded by its path, not from sys.path, and
    only once torch.distributed is. Where it cannot load (not built, another interpreter), a
    Python function does the same, and shows as two frames in tracebacks through the call."""
    global _around_function
    if _around_function is None:
        _around_function = _load_around()
    return _around_function


def _load_around():
    try:
        import importlib.machinery
        import importlib.util

        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), _AROUND_FILE)
        loader = importlib.machinery.ExtensionFileLoader("_ddprun_around", path)
        spec = importlib.util.spec_from_file_location("_ddprun_around", path, loader=loader)
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
        return module.around
    except Exception:
        return _around_in_python


def _around_in_python(target, before, after):
    """around() where the native one cannot load."""
    def call(*args, **kwargs):
        token = before(args, kwargs)
        if token is None:
            return target(*args, **kwargs)
        try:
            result = target(*args, **kwargs)
        except BaseException:
            after(token, None, True)
            raise
        after(token, result, False)
        return result

    for name in ("__module__", "__name__", "__qualname__", "__doc__"):
        try:
            setattr(call, name, getattr(target, name))
        except (AttributeError, TypeError):
            pass
    call.__wrapped__ = target
    return call


# At most this many Works wait for a completion that only Python sees; past it, the oldest
# completed ones are let go and the rest recorded as finished (no false hang from a program
# that never waits for its sends).
_OPEN_WORKS_MAX = 4096


class _OpenWorks:
    """Works whose completion the probe sees only from Python: those without a future (Gloo's
    send, recv, reduce_scatter: get_future raises) and every send or recv. Each is finished by
    whichever comes first: its wait() returning (Work.wait is wrapped: while a thread waits for
    a send or recv, the lane's p2p words say so), or is_completed() seen when the thread issues
    its next collective, or at a DDP step's end. Holding the Work keeps its Python object
    alive, so that the program's wait() is called on this same object."""

    def __init__(self, recorder):
        self._recorder = recorder
        self.open = {}  # id(work) -> (work, lane, seq (0: a send or recv), p2p or None)
        self.is_completed = None  # Work.is_completed as PyTorch has it (_wrap_work sets it)

    def add(self, work, lane, seq, p2p=None):
        if len(self.open) >= _OPEN_WORKS_MAX:
            self.sweep(force=True)
        self.open[id(work)] = (work, lane, seq, p2p)

    def sweep(self, force=False):
        """Finishes the completed ones (force: every one)."""
        for key, (work, lane, seq, _) in list(self.open.items()):
            try:
                done = force or (self.is_completed or type(work).is_completed)(work)
            except Exception:
                done = True
            if done and self._recorder.finish(lane, seq):
                self.open.pop(key, None)

    def wait_before(self, args, kwargs):
        """Before work.wait(): a token for wait_after, or None when the Work is not open."""
        if not self.open:
            return None
        work = args[0]
        entry = self.open.get(id(work))
        if entry is None or entry[0] is not work:
            return None
        _, lane, seq, p2p = entry
        waiting = False
        try:
            waiting = p2p is not None and self._recorder.p2p_wait(lane, *p2p)
        except Exception as error:
            self._recorder.stop(error)
        return (work, lane, seq, waiting)

    def wait_after(self, token, result, failed):
        """After work.wait() returned `result`, or raised (failed)."""
        work, lane, seq, waiting = token
        if waiting:
            try:
                self._recorder.p2p_done(lane)
            except Exception as error:
                self._recorder.stop(error)
        if failed or result is not False:  # False: wait(timeout) timed out
            self._finished(work, lane, seq, failed)
        if self.open:  # time passed: others may have completed meanwhile
            self.sweep()

    def stop(self, error):
        self._recorder.stop(error)

    def _finished(self, work, lane, seq, failed):
        try:
            if self._recorder.finish(lane, seq, failed):
                self.open.pop(id(work), None)
        except Exception as error:
            self._recorder.stop(error)

    def future_taken(self, work, future):
        """The program took an open Work's future (to wait on it, or chain it): the collective
        is finished when the future completes."""
        entry = self.open.get(id(work))
        if entry is None or entry[0] is not work or future is None:
            return
        _, lane, seq, p2p = entry

        def done(future):
            failed = False
            try:
                future.value()  # raises the collective's error
            except Exception:
                failed = True
            self._finished(work, lane, seq, failed)

        future.add_done_callback(done)

    def completed(self, work):
        """The program saw an open Work completed (is_completed() returned True)."""
        entry = self.open.get(id(work))
        if entry is not None and entry[0] is work:
            self._finished(work, entry[1], entry[2], False)


def _wrap_work(work_class, works, around):
    """Work.wait, get_future and is_completed, through `works` while any Work is open."""
    wait, get_future, is_completed = (work_class.wait, work_class.get_future,
                                      work_class.is_completed)
    works.is_completed = is_completed

    def work_if_open(args, kwargs):
        return args[0] if works.open else None

    def future_taken(work, future, failed):
        try:
            if not failed:
                works.future_taken(work, future)
        except Exception as error:
            works.stop(error)

    def completed(work, done, failed):
        try:
            if done and not failed:
                works.completed(work)
        except Exception as error:
            works.stop(error)

    work_class.wait = around(wait, works.wait_before, works.wait_after)
    work_class.get_future = around(get_future, work_if_open, future_taken)
    work_class.is_completed = around(is_completed, work_if_open, completed)


# --- PyTorch 2.14: the process groups' own hooks ---------------------------------------------

_HOOK_ID = 0x6464707275  # "ddpru": ours among a group's hooks

_HOOK_OPS = {  # HookOpName member name -> Op; None: not a collective (no record)
    "ALLREDUCE": ALL_REDUCE, "ALLREDUCE_COALESCED": ALL_REDUCE, "ALLREDUCE_SPARSE": ALL_REDUCE,
    "_ALLREDUCE_SPARSE": ALL_REDUCE, "BROADCAST": BROADCAST,
    "ALLGATHER": ALL_GATHER, "ALLGATHER_BASE": ALL_GATHER, "ALLGATHER_COALESCED": ALL_GATHER,
    "ALLGATHER_INTO_TENSOR_COALESCED": ALL_GATHER, "_ALLGATHER_BASE": ALL_GATHER,
    "REDUCE_SCATTER": REDUCE_SCATTER, "REDUCE_SCATTER_BASE": REDUCE_SCATTER,
    "REDUCE_SCATTER_TENSOR_COALESCED": REDUCE_SCATTER, "_REDUCE_SCATTER_BASE": REDUCE_SCATTER,
    "BARRIER": BARRIER, "REDUCE": REDUCE, "_REDUCE_OOP": REDUCE, "GATHER": GATHER,
    "SCATTER": SCATTER, "ALLTOALL": ALL_TO_ALL, "ALLTOALL_BASE": ALL_TO_ALL,
    "SEND": SEND, "RECV": RECV, "RECVANYSOURCE": RECV,
    "SPLIT": None, "NEW_WINDOW": None,  # make a group or a window: no collective to wait in
}
# Ops whose inputs are not what one rank contributes: counted by their outputs.
_COUNT_OUTPUTS = (REDUCE_SCATTER, SCATTER, RECV)
_P2P = (SEND, RECV)


def _op_of(name):
    """The Op of a HookOpName member's name: ours, or OTHER for one we do not know; None for a
    call that is no collective. Coalesced variants are the op they coalesce."""
    return _HOOK_OPS.get(name, OTHER)


_C10D_MODULE = "torch.distributed.distributed_c10d"


def _finish_when_done(probe, lane, seq, work, waited_in_python=False):
    """`lane`'s collective seq is finished when work's future completes (its callback runs on
    the backend's thread); when there is no future (Gloo's reduce_scatter: "not implemented"),
    or when the Work goes back to Python code (waited_in_python: c10d's own functions, which
    wait for a synchronous call at once and hand an asynchronous one's Work to the program),
    once Python sees it complete (_OpenWorks: its wait, its future, the next collective); at
    once when there is no work. A future's callback costs a hand-over of the GIL to the
    backend's thread for every collective: Works that Python waits for need none."""
    future = None
    if work is not None and waited_in_python:
        probe.works.add(work, lane, seq)
        return
    if work is not None:
        try:
            future = work.get_future()
        except (AttributeError, RuntimeError):
            pass
    if future is not None:
        future.add_done_callback(probe.done_callback(lane, seq))
    elif work is not None:
        probe.works.add(work, lane, seq)
    else:
        probe.recorder.finish(lane, seq)


def _inside_hooks(codes):
    """Whether a frame below the caller's runs one of `codes`: the hook that issued this
    collective is itself in progress on this thread (a signal handler interrupted it)."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code in codes:
            return True
        frame = frame.f_back
    return False


def _hook_group(probe, group, lane, hook_op_name):
    """Registers ours as `group`'s pre and post hooks, recording into `lane`."""
    recorder, state, works = probe.recorder, probe.state, probe.works
    ops = {member: _op_of(member.name) for member in hook_op_name.__members__.values()}
    token = object()  # this group, as a pair's key: the group itself would be a reference cycle
    # through C++ (the group holds the hooks) that keeps it alive after destroy_process_group

    def pre_hook(args):
        if not recorder.writing:
            return
        try:
            op = ops.get(args.name, OTHER)
            if op is None:
                return
            if state.open_seq or state.open_p2p is not None:
                if _inside_hooks(hook_codes):  # a signal handler's collective inside ours
                    recorder.skipped(lane)
                    return
                # The last call on this thread raised before its post hook.
                recorder.finish(state.open_lane, state.open_seq, True, False)
                state.open_seq, state.open_p2p = 0, None
            if works.open:
                works.sweep()
            tensors = args.output_tensors if op in _COUNT_OUTPUTS else args.input_tensors
            dtype, count, nbytes = _measure(tensors)
            if op in _P2P:
                peer = args.root if args.root >= 0 else NO_PEER
                state.open_p2p = (op, nbytes, peer)
            else:
                state.open_seq = recorder.queue(lane, op, dtype, count, nbytes)
            state.open_lane = lane
            state.open_id = args.op_id
            state.open_group = token
        except Exception as error:
            recorder.stop(error)

    def post_hook(args):
        if not recorder.writing:
            return
        try:
            if state.open_id != args.op_id or state.open_group is not token:
                return
            seq, p2p = state.open_seq, state.open_p2p
            state.open_seq, state.open_p2p, state.open_group = 0, None, None
            if p2p is not None:
                if args.work is not None:
                    works.add(args.work, lane, 0, p2p)
            elif seq:
                # Called by c10d's Python functions (the program's collectives), not from C++
                # (DDP's buckets, its construction): Python sees the Work's wait.
                try:
                    caller = sys._getframe(1)
                except ValueError:  # no Python below: a thread of C++'s (autograd's)
                    caller = None
                from_c10d = caller is not None and caller.f_globals.get("__name__") == _C10D_MODULE
                _finish_when_done(probe, lane, seq, args.work, from_c10d)
        except Exception as error:
            recorder.stop(error)

    hook_codes = (pre_hook.__code__, post_hook.__code__)
    group.register_pre_hook(_HOOK_ID, pre_hook)
    group.register_post_hook(_HOOK_ID, post_hook)


def _unhook_groups(hooked):
    """At exit, takes our hooks off the groups still alive. A group the program never destroyed
    lives in c10d's C++ registry until the C++ static destructors, after Python is gone, and
    destroying a Python hook then aborts the process ("Fatal Python error: gilstate_tss_set")."""
    for reference in hooked:
        group = reference()
        if group is None:
            continue
        try:
            group.unregister_pre_hook(_HOOK_ID)
            group.unregister_post_hook(_HOOK_ID)
        except Exception:
            pass


# --- PyTorch 1.13: the Python collective functions -------------------------------------------

# name -> (Op, the argument whose tensors one rank sends). Those absent in a version are skipped.
_FUNCTIONS = {
    "all_reduce": (ALL_REDUCE, "tensor"),
    "all_reduce_coalesced": (ALL_REDUCE, "tensors"),
    "broadcast": (BROADCAST, "tensor"),
    "all_gather": (ALL_GATHER, "tensor"),
    "all_gather_into_tensor": (ALL_GATHER, "input_tensor"),
    "_all_gather_base": (ALL_GATHER, "input_tensor"),
    "all_gather_coalesced": (ALL_GATHER, "input_tensor_list"),
    "reduce_scatter": (REDUCE_SCATTER, "output"),
    "reduce_scatter_tensor": (REDUCE_SCATTER, "output"),
    "_reduce_scatter_base": (REDUCE_SCATTER, "output"),
    "reduce": (REDUCE, "tensor"),
    "gather": (GATHER, "tensor"),
    "scatter": (SCATTER, "tensor"),
    "all_to_all": (ALL_TO_ALL, "input_tensor_list"),
    "all_to_all_single": (ALL_TO_ALL, "input"),
    "barrier": (BARRIER, None),
    "send": (SEND, "tensor"),
    "isend": (SEND, "tensor"),
    "recv": (RECV, "tensor"),
    "irecv": (RECV, "tensor"),
}
_ALWAYS_ASYNC = ("isend", "irecv")  # return a Work, take no async_op
_PEER_ARGUMENT = {SEND: "dst", RECV: "src"}


def _position(parameters, name):
    return parameters.index(name) if name in parameters else -1


def _wrap_collective(probe, around, function, op, tensor_name, non_member, parameters=None):
    """`function` recording each call: a collective in its group's lane, finished when a
    synchronous call returns (failed if it raises), or when an asynchronous call's Work
    completes; a send or recv as a p2p wait while a thread waits for it. Arguments and results
    pass through untouched. parameters: the names of function's parameters, where Python cannot
    read them (a C++ function)."""
    import inspect

    recorder, state, works = probe.recorder, probe.state, probe.works
    if parameters is None:
        parameters = list(inspect.signature(function).parameters)
    tensor_at = _position(parameters, tensor_name)
    group_at = _position(parameters, "group")
    async_at = _position(parameters, "async_op")
    peer_name = _PEER_ARGUMENT.get(op)
    peer_at = _position(parameters, peer_name) if peer_name else -1
    always_async = function.__name__ in _ALWAYS_ASYNC

    def argument(args, kwargs, at, name, default):
        if 0 <= at < len(args):
            return args[at]
        return kwargs.get(name, default) if kwargs else default

    def before(args, kwargs):
        if not recorder.writing or state.inside:
            return None
        try:
            group = argument(args, kwargs, group_at, "group", None)
            lane = probe.lane_of(group) if group is not non_member else None
            is_async = always_async or argument(args, kwargs, async_at, "async_op", False)
            seq, p2p, waiting = 0, None, False
            if lane is not None:
                if works.open:
                    works.sweep()
                try:
                    size = _measure(argument(args, kwargs, tensor_at, tensor_name, None))
                except Exception:  # not tensors: the call itself will say so
                    size = (0, 0, 0)
                if op in _P2P:
                    peer = argument(args, kwargs, peer_at, peer_name, None)
                    p2p = (op, size[2], peer if isinstance(peer, int) and peer >= 0 else NO_PEER)
                    waiting = not is_async and recorder.p2p_wait(lane, *p2p)
                else:
                    seq = recorder.queue(lane, op, *size)
        except Exception as error:
            recorder.stop(error)
            return None
        state.inside = True
        return (lane, seq, p2p, waiting, is_async)

    def after(token, result, failed):
        state.inside = False
        lane, seq, p2p, waiting, is_async = token
        try:
            if waiting:
                recorder.p2p_done(lane)
            if failed:
                recorder.finish(lane, seq, True)  # a communication error, or the arguments'
            elif p2p is not None:
                if is_async and result is not None:
                    works.add(result, lane, 0, p2p)
            elif seq:  # an asynchronous call's Work goes to the program: Python sees it
                _finish_when_done(probe, lane, seq, result if is_async else None, True)
        except Exception as error:
            recorder.stop(error)

    return around(function, before, after)


def _wrap_functions(probe, around, dist, c10d):
    """Wraps c10d's collective functions, in c10d (which calls them itself: all_gather_object
    calls all_gather) and in torch.distributed (which imported them by name)."""
    non_member = c10d.GroupMember.NON_GROUP_MEMBER
    for name, (op, tensor_name) in _FUNCTIONS.items():
        original = getattr(c10d, name, None)
        if original is None:
            continue
        wrapped = _wrap_collective(probe, around, original, op, tensor_name, non_member)
        setattr(c10d, name, wrapped)
        if getattr(dist, name, None) is original:
            setattr(dist, name, wrapped)
    # DDP's buffer broadcast at the start of each forward (and its parameters' and buffers' at
    # construction) calls this C++ function through torch.distributed: a rank that waits in it
    # waits in a collective (a BatchNorm model's forward, or the hang names the wrong rank).
    original = getattr(dist, "_broadcast_coalesced", None)
    if original is not None:
        dist._broadcast_coalesced = _wrap_collective(
            probe, around, original, BROADCAST, "tensors", non_member,
            parameters=["group", "tensors", "buffer_size", "src"])


# --- Process groups -----------------------------------------------------------------------------


def _backend_name(backend):
    """The backend's name from init_process_group's string: gloo of "gloo", nccl (the device
    backend) of "cpu:gloo,cuda:nccl"."""
    names = [entry.rpartition(":")[2] for entry in str(backend).lower().split(",")]
    return "nccl" if "nccl" in names else names[0]


def _timeout_ms(timeout):
    return int(timeout.total_seconds() * 1000) if timeout is not None else 0


def _context(name):
    """A process group's context word from its c10d name, the same on every rank: "0" (the
    default group) -> 1, "1" -> 2...; a hashed name (use_local_synchronization) ->
    HASHED_CONTEXT | 32 bits of it."""
    name = str(name)
    if name.isdigit() and int(name) + 1 < HASHED_CONTEXT:
        return int(name) + 1
    import zlib

    return HASHED_CONTEXT | zlib.crc32(name.encode())


def _group_name(c10d, group, given):
    """The c10d name of `group` (2.x: group.group_name; 1.13: its entry in _pg_names)."""
    name = getattr(group, "group_name", None)
    if name is None:
        name = getattr(c10d, "_pg_names", {}).get(group)
    return given if name is None else name


def _watch_groups(probe, dist, c10d):
    """Wraps _new_process_group_helper (every group: init_process_group's, new_group's) and
    split_group. The first group (the default one) claims the page and records in lane 0, each
    other group in a lane of its own, where PyTorch has hooks through them. NCCL groups are left
    to ddprun's NCCL profiler plugin: their futures complete when the work is queued on the GPU,
    which tells nothing of a hang; a job whose default group is NCCL is not recorded here at
    all (the plugin records it)."""
    import inspect
    import weakref

    recorder = probe.recorder
    process_group = dist.ProcessGroup
    probe.group_lanes = weakref.WeakKeyDictionary()
    hooks = None
    if probe.hooks:
        hooks = sys.modules["torch._C._distributed_c10d"].HookOpName
        hooked = []  # weak references to the groups that hold our hooks
        atexit.register(_unhook_groups, hooked)

    def new_group(group, backend, timeout, name):
        if not isinstance(group, process_group) or probe.nccl_job:  # not a member; NCCL's
            return
        backend = _backend_name(backend)
        timeout_ms = _timeout_ms(timeout)
        default = c10d._get_default_group() if c10d.is_initialized() else group
        if default is group:
            if backend == "nccl":
                probe.nccl_job = True
                return
            lane = recorder.claim(group.rank(), group.size(), backend, timeout_ms, _context(name))
            probe.default_lane = lane
        else:
            if backend == "nccl":
                return
            recorder.raise_timeout(timeout_ms)
            lane = recorder.open_lane(_context(name), group.rank(), group.size(), backend,
                                      timeout_ms)
        if lane is None:  # the page is not ours, or every lane is taken
            return
        if hooks is not None:
            _hook_group(probe, group, lane, hooks)
            hooked.append(weakref.ref(group))
        else:
            probe.group_lanes[group] = lane

    around = _around()
    helper = c10d._new_process_group_helper
    helper_signature = inspect.signature(helper)

    def call(args, kwargs):  # every group, the default one before the page is claimed
        return (args, kwargs or {})

    def helper_returned(call, result, failed):
        if failed:
            return
        try:
            arguments = helper_signature.bind(*call[0], **call[1])
            arguments.apply_defaults()
            group = result[0] if isinstance(result, tuple) else result  # 2.x: (group, store)
            new_group(group, arguments.arguments["backend"], arguments.arguments.get("timeout"),
                      _group_name(c10d, group, arguments.arguments.get("group_name")))
        except Exception as error:
            recorder.stop(error)

    c10d._new_process_group_helper = around(helper, call, helper_returned)

    split = getattr(c10d, "split_group", None)  # 2.x: groups split from a parent, no helper
    if split is None:
        return
    split_signature = inspect.signature(split)

    def split_returned(call, group, failed):
        if failed:
            return
        try:
            timeout = split_signature.bind(*call[0], **call[1]).arguments.get("timeout")
            if isinstance(group, process_group):
                new_group(group, c10d.get_backend(group), timeout,
                          _group_name(c10d, group, None))
        except Exception as error:
            recorder.stop(error)

    split_group = around(split, call, split_returned)
    c10d.split_group = split_group
    if getattr(dist, "split_group", None) is split:
        dist.split_group = split_group


# --- DDP steps ------------------------------------------------------------------------------------


def _first_tensor_requiring_grad(value, depth=0):
    """The first tensor requiring grad in a forward's output (a tensor, or tuples, lists and
    dicts of them), or None."""
    if getattr(value, "requires_grad", False) and hasattr(value, "register_hook"):
        return value
    if depth > 4:
        return None
    if isinstance(value, dict):
        value = value.values()
    elif not isinstance(value, (list, tuple)):
        return None
    for item in value:
        found = _first_tensor_requiring_grad(item, depth + 1)
        if found is not None:
            return found
    return None


class _StepWatch:
    """One DDP step: a tensor hook on the forward's output marks the start of backward, and an
    autograd final callback its end (queued from another final callback, so that it runs after
    DDP's own, which waits for the gradients' reduction)."""

    def __init__(self, probe, engine, step, begin_ns, gradients):
        self._probe = probe
        self._recorder = probe.recorder
        self._engine = engine
        self._step = step
        self._begin_ns = begin_ns
        self._ready_ns = 0
        self._gradients = gradients  # (lane, dtype, count, bytes) to record as Op 13, or None
        self._seq = 0  # the Op 13 collective, while it is open
        self.ended_ns = 0  # when backward ended: the next step begins there (0: not yet)

    def backward_began(self, grad):
        try:
            if self._ready_ns:  # a second backward through the same graph
                return None
            self._ready_ns = now = time.monotonic_ns()
            rec = self._recorder
            rec.step_time(self._step, S_READY_NS, self._begin_ns, now, COMPUTE_NS_TOTAL)
            if self._gradients is not None:
                lane, dtype, count, nbytes = self._gradients
                self._seq = rec.queue(lane, GRADIENTS, dtype, count, nbytes)
            self._engine.queue_callback(self._after_others)
        except Exception as error:
            self._recorder.stop(error)
        return None  # the gradient passes unchanged

    def _after_others(self):
        try:
            self._engine.queue_callback(self._backward_ended)
        except Exception as error:
            self._recorder.stop(error)

    def _backward_ended(self):
        try:
            now = time.monotonic_ns()
            self.ended_ns = now
            rec = self._recorder
            rec.step_time(self._step, S_FINALIZED_NS, self._ready_ns, now, WAIT_NS_TOTAL)
            seq, self._seq = self._seq, 0
            if seq:
                rec.finish(self._gradients[0], seq)
            works = self._probe.works
            if works.open:  # DDP waited for its buckets: those without a future are done
                works.sweep()
        except Exception as error:
            self._recorder.stop(error)

    def abandon(self):
        """The thread began another step: if this backward began and never ended, it raised.
        Its Op 13 collective is closed as failed (the reduction never completed), lest
        `finished` stop there for good; the communicator is not known broken."""
        seq, self._seq = self._seq, 0
        if seq:
            self._recorder.finish(self._gradients[0], seq, True, False)


def _gradients(probe, module, sizes):
    """(lane, dtype, count, bytes) of the parameters of a DDP module that require grad (cached),
    in the lane of its process group; None when that group is not recorded."""
    size = sizes.get(module)
    if size is None:
        size = sizes[module] = _measure([p for p in module.parameters() if p.requires_grad])
    lane = probe.lane_of(getattr(module, "process_group", None))
    return None if lane is None else (lane,) + size


def _watch_steps(probe, torch, ddp_class, with_gradients):
    """Wraps DistributedDataParallel.forward: a forward that will reduce gradients (grad enabled,
    outside no_sync) begins a step."""
    import weakref

    recorder, state = probe.recorder, probe.state
    forward = ddp_class.forward
    is_grad_enabled = torch.is_grad_enabled
    engine = torch.autograd.Variable._execution_engine
    sizes = weakref.WeakKeyDictionary()

    def begin(args, kwargs):
        if not recorder.writing or not is_grad_enabled():
            return None
        if not getattr(args[0], "require_backward_grad_sync", True):  # inside no_sync()
            return None
        # As libddp's steps: a step begins where the last one's backward ended, so that its data
        # loading counts as its compute (a rank slow to load is a straggler); the first at its
        # forward.
        begin_ns = time.monotonic_ns()
        step = 0
        try:
            if state.last_step is not None:
                begin_ns = state.last_step.ended_ns or begin_ns
                state.last_step.abandon()
                state.last_step = None
            step = recorder.begin_step(begin_ns)
        except Exception as error:
            recorder.stop(error)
        return (args[0], step, begin_ns) if step else None

    def forwarded(token, output, failed):
        if failed:
            return
        module, step, begin_ns = token
        try:
            tensor = _first_tensor_requiring_grad(output)
            if tensor is not None:
                gradients = _gradients(probe, module, sizes) if with_gradients else None
                state.last_step = watch = _StepWatch(probe, engine, step, begin_ns, gradients)
                tensor.register_hook(watch.backward_began)
        except Exception as error:
            recorder.stop(error)

    ddp_class.forward = _around()(forward, begin, forwarded)


# --- Instrumenting torch as it is imported ------------------------------------------------------


class _ImportWatch:
    """A sys.meta_path finder that finds nothing itself: lets a watched module import as it
    would, then calls its callback with the module. Leaves sys.meta_path once every watched
    module was imported. (Not an importlib.abc.MetaPathFinder: importing importlib.abc at
    start-up costs more than the probe.)"""

    def __init__(self, callbacks):
        self._callbacks = dict(callbacks)  # module name -> callback(module)
        self._finding = None  # the name we are asking the other finders for

    def find_spec(self, name, path=None, target=None):
        if name not in self._callbacks or name == self._finding:
            return None
        import importlib.util

        self._finding = name
        try:
            spec = importlib.util.find_spec(name)  # the finders after us, other hooks included
        except Exception:
            return None  # the import system will say why, without us
        finally:
            self._finding = None
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_instrument(module):
            exec_module(module)
            # Only once the module ran: a find_spec alone (a library probing whether torch
            # has it) imports nothing.
            callback = self._callbacks.pop(name, None)
            if not self._callbacks and self in sys.meta_path:
                sys.meta_path.remove(self)
            if callback is not None:
                callback(module)

        spec.loader.exec_module = exec_then_instrument
        return spec


class _Probe:
    """The instrumentation of one process: what to do as torch's modules arrive."""

    def __init__(self, recorder):
        self.recorder = recorder
        self.state = _ThreadState()
        self.works = _OpenWorks(recorder)
        self.hooks = False  # the process groups have pre/post hooks (PyTorch 2.x)
        self.distributed = False  # torch.distributed is available and instrumented
        self.nccl_job = False  # the default group is NCCL's: the plugin records, not us
        self.default_lane = None  # the default group's lane (lane 0), once claimed
        # 1.13: process group -> its lane (the recorded ones). Weak (_watch_groups makes it): a
        # group the program destroyed must die with its threads, as it would without us, not at
        # the interpreter's exit (where a Gloo thread that frees a tensor aborts the process).
        self.group_lanes = {}

    def lane_of(self, group):
        """The lane a call on `group` (None: the default group) records in; None: none."""
        if group is None:
            return self.default_lane
        try:
            return self.group_lanes.get(group)
        except TypeError:  # not hashable: not a group of ours
            return None

    def done_callback(self, lane, seq):
        """A future's done callback that finishes `lane`'s collective `seq` (no import on this
        path: it runs for every collective C++ waits for)."""
        future_done = self.recorder.future_done
        return lambda future: future_done(lane, seq, future)

    def on_distributed(self, dist):
        try:
            _drop_old_flight_recorder_names(sys.modules["torch"].__version__)
            if not dist.is_available():
                return
            c10d = sys.modules["torch.distributed.distributed_c10d"]
            self.hooks = hasattr(dist.ProcessGroup, "register_pre_hook")
            _watch_groups(self, dist, c10d)
            around = _around()
            if not self.hooks:
                _wrap_functions(self, around, dist, c10d)
            _wrap_work(sys.modules["torch._C._distributed_c10d"].Work, self.works, around)
            self.distributed = True
        except Exception as error:
            self.recorder.stop(error)

    def on_dynamo(self, module):
        """torch.compile must not trace this module: its hooks run inside compiled regions
        (called back from C++), and it would try to compile them, and break its graphs on the
        forward wrapper. Best effort: without it, recording stays right, only slower."""
        try:
            import importlib

            importlib.import_module("torch._dynamo.trace_rules").add(__name__)
        except Exception:
            pass

    def on_ddp(self, module):
        try:
            if self.distributed:
                torch = sys.modules["torch"]
                _watch_steps(self, torch, module.DistributedDataParallel, not self.hooks)
        except Exception as error:
            self.recorder.stop(error)


def _drop_old_flight_recorder_names(version):
    """ddprun sets PyTorch's Flight Recorder variables under both names (DDPRUN_FR_OLD_NAMES
    lists the old ones it set): a PyTorch that reads the TORCH_FR_ names (2.10 and later) warns
    on every rank that the old ones are deprecated, as torchrun's jobs never do. Drop them
    there, before the first process group reads them."""
    names = os.environ.pop(_contract.FR_OLD_NAMES, "")
    numbers = version.split("+")[0].split(".")
    try:
        reads_new_names = (int(numbers[0]), int(numbers[1])) >= (2, 10)
    except (IndexError, ValueError):
        return
    if reads_new_names:
        for name in filter(None, names.split(",")):
            os.environ.pop(name, None)


# The stack file (DDPRUN_STACK_FD) as /proc/self/fd shows the agent's, and the highest number
# its private copy takes (_private_stack_fd).
STACK_FILE_LINK = "/memfd:ddprun-python-stacks"
STACK_FD_CEILING = 1024


def _private_stack_fd(fd):
    """A copy of the agent's stack file `fd` where the program does not reach it, and `fd`
    closed; None when `fd` is not the agent's stack file in this process (not inherited: an
    exec'd program's, or a number the program reused).

    faulthandler keeps a descriptor's number, not the file: a program that closes its
    descriptors (os.closerange(3, 64)) and opens its checkpoint would get that number, and the
    next dump would land in the checkpoint. So the copy is high-numbered (programs take the
    lowest free number; ranges they close start low), below the process's descriptor limit and
    at most about 1000 (the kernel sizes a process's descriptor table by its highest number),
    and close-on-exec (a program exec'd from here has no probe to dump into it). The agent
    checks that this number still holds its file before each signal (the page's stack_fd)."""
    try:
        if not os.readlink("/proc/self/fd/%d" % fd).startswith(STACK_FILE_LINK):
            return None
    except OSError:
        return None
    import fcntl  # built into Debian's Pythons; elsewhere in lib-dynload

    limit = os.sysconf("SC_OPEN_MAX")  # RLIMIT_NOFILE's soft limit; -1: none
    if limit <= 0:
        limit = STACK_FD_CEILING
    floor = max(3, min(limit, STACK_FD_CEILING) - 16)
    private = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, floor)
    os.close(fd)
    return private


def _register_stack_signal(words):
    """faulthandler dumps every thread's stack into the agent's stack file (DDPRUN_STACK_FD,
    through a private copy) on DDPRUN_STACK_SIGNAL; the page says on which descriptor, then
    which signal."""
    signal_text = os.environ.get(_contract.STACK_SIGNAL)
    fd_text = os.environ.get(_contract.STACK_FD)
    if not signal_text or not fd_text:
        return
    signal_number = int(signal_text)
    fd = _private_stack_fd(int(fd_text))
    if fd is None:
        return
    faulthandler.register(signal_number, file=fd, all_threads=True, chain=False)
    words[STACK_FD] = fd
    words[STACK_SIGNAL] = signal_number


def _write_error_file():
    """At exit of a `python -m` worker: an uncaught exception (PyErr_Print left it in
    sys.last_value) written to TORCHELASTIC_ERROR_FILE as torchelastic's @record writes it, so
    that the failure report shows its traceback, unless the program's own @record wrote one.
    Runs from atexit: no frame of ours is on the program's stack, and its traceback, sys.path
    and exit status are the interpreter's own."""
    error = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not isinstance(error, Exception) or not path or os.path.exists(path):
        return
    try:
        import json
        import traceback

        callstack = "".join(traceback.format_exception(type(error), error,
                                                       error.__traceback__))
        data = {"message": {"message": "%s: %s" % (type(error).__name__, error),
                            "extraInfo": {"py_callstack": callstack,
                                          "timestamp": str(int(time.time()))}}}
        with open(path, "w") as error_file:
            json.dump(data, error_file)
    except Exception:
        pass


_probe = None  # this process's, once install() made it


def unfinished_collectives():
    """The collectives this process issued and has not seen finish ((lane, number) pairs);
    empty where nothing is recorded. For ddprun.inplace's watcher: a collective still
    unfinished seconds after its group's connections were shut will not end."""
    probe = _probe
    if probe is None:
        return frozenset()
    try:
        return probe.recorder.unfinished()
    except Exception:
        return frozenset()


def install():
    """Registers the stack signal and waits for torch.distributed. Does nothing without the
    agent's page; raises if the page or the variables are broken."""
    fd_text = os.environ.get(_contract.RECORD_FD)
    if not fd_text:
        return
    words = _map_page(int(fd_text))
    if words is None or words[PID] != 0:  # not ours: inherited from the worker that ran us
        return
    if sys.argv[:1] == ["-m"]:  # python -m, before runpy: ddprun's own error file for it
        atexit.register(_write_error_file)
    _register_stack_signal(words)
    global _probe
    probe = _probe = _Probe(Recorder(words))
    modules_file = os.environ.get(_contract.MODULES_FILE)
    # A worker forked from the warm template: the variable came after this module's import,
    # but the template imported the module for itself.
    modules = _ddprun_modules or sys.modules.get("_ddprun_modules")
    if modules_file and modules is not None:  # ddprun warms restarts: it learns from this
        watch = modules.EnvironmentWatch()  # what to import, and in which environment
        sys.meta_path.insert(0, watch)
        report = modules.ModuleReport(modules_file, watch)
        probe.recorder.on_queued = report.collective
        atexit.register(report.write)
    os.register_at_fork(after_in_child=probe.recorder.forked)
    watched = {
        "torch.distributed": probe.on_distributed,
        "torch.nn.parallel.distributed": probe.on_ddp,
        "torch._dynamo": probe.on_dynamo,  # PyTorch 2.x, imported by torch.compile
    }
    pending = {name: cb for name, cb in watched.items() if name not in sys.modules}
    if pending:
        sys.meta_path.insert(0, _ImportWatch(pending))
    for name, callback in watched.items():  # imported already (by a user's sitecustomize)
        if name not in pending:
            callback(sys.modules[name])
