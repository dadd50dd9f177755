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
- The page is claimed (pid word 0 -> our pid) when the first process group is made, then
  published by writing magic last. A page another process claimed (libddp in this process, the
  worker that exec'd us with its descriptors) is left alone, and a forked child (DataLoader
  workers) never writes. On an internal error the probe unpublishes the page (magic 0) rather
  than leave a frozen record that would read as a hang.
- Writes are 64-bit stores through a memoryview under one lock (future callbacks run on the
  backends' threads); each slot is a seqlock, as in the header.

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
- Gloo's reduce_scatter Work has no future (get_future raises "not implemented"): recorded as
  finished when issued. monitored_barrier bypasses the hooks.
- input_tensors are what the rank sends, except for SCATTER (the root's whole list) and
  REDUCE_SCATTER (the whole input): the count is taken from output_tensors for those and RECV.
- A hook that raises raises into the user's call, so every hook here catches everything.
- A group never destroyed outlives Python (c10d's C++ registry) and destroying our hooks then
  aborts the process: they are unregistered at exit.
- torch.compile would trace the hooks (run from C++ inside compiled regions) and the forward
  wrapper: this module is put on dynamo's skip list once torch._dynamo is imported.
- PyTorch 1.13 has no such hooks: its Python collective functions are wrapped instead. Any
  exception from one marks it failed, the header too: an argument error looks like a broken
  communicator. As DDP's Reducer calls the backend from C++, each step's gradient reduction is
  recorded as one collective (Op 13) from the start to the end of backward.
- Both: a callback queued with the autograd engine's queue_callback from inside a final callback
  runs after DDP's own finalize callback, once the gradients are averaged: that is a step's end.
- Not checked (no GPU here): NCCL. Its futures complete when the work is enqueued on the
  stream, so there `finished` means handed to the GPU, not done.

Cost, measured with Gloo in a world of 1, 1-element all_reduce, on a loaded 2-core machine:
1.13 +5 us per collective (9 -> 14 us), 2.14 +18 us (15 -> 33 us): PyTorch's hook dispatch
about 1.5 us, the future's done callback (run on Gloo's thread: a GIL hand-off) most of the
rest, the recording itself about 1.5 us. Start-up: about 1 ms, with this module's .pyc cached.
"""

import _thread
import atexit
import faulthandler
import mmap
import os
import struct
import sys
import time

# functools, weakref and inspect are imported where torch is instrumented, not at start-up: the
# probe loads into every Python worker, torch or not (threading: _thread, for the same reason).

# --- The page (collective_record.hpp) --------------------------------------------------------

RECORD_MAGIC = 0x3130434552504444  # "DDPREC01"
RECORD_VERSION = 2
HEADER_WORDS = 32
COLLECTIVE_SLOTS = 256
COLLECTIVE_WORDS = 16
STEP_SLOTS = 64
STEP_WORDS = 8
STEP_BASE = HEADER_WORDS + COLLECTIVE_SLOTS * COLLECTIVE_WORDS
# libddp's other communicators (lanes 1..3: a 16-word header and a ring each); the probe
# writes lane 0 only.
EXTRA_LANES = 3
LANE_WORDS = 16 + COLLECTIVE_SLOTS * COLLECTIVE_WORDS
PAGE_BYTES = (STEP_BASE + STEP_SLOTS * STEP_WORDS + EXTRA_LANES * LANE_WORDS) * 8  # 135808
NO_BUCKET = 0xFFFFFFFFFFFFFFFF
# Adjacent words written in one call; native format: each word is one aligned 8-byte store.
_SLOT_FIELDS = struct.Struct("10Q")  # a collective slot's seq .. failed
_TWO_WORDS = struct.Struct("2Q")

# Header words.
MAGIC, VERSION, PID, RANK, WORLD_SIZE, BACKEND = 0, 1, 2, 3, 4, 5
QUEUED, STARTED, FINISHED, LAST_FINISHED_NS, FAILED = 6, 7, 8, 9, 10
STEPS, COMPUTE_NS_TOTAL, WAIT_NS_TOTAL = 11, 12, 13
WRITER, STACK_SIGNAL, TIMEOUT_MS = 15, 16, 17
LANE_STATE, CONTEXT = 18, 19  # lane 0's state (1: open) and which process group (1: the first)
# Collective slot words.
C_VERSION, C_SEQ, C_OP, C_DTYPE, C_COUNT, C_BYTES, C_BUCKET = 0, 1, 2, 3, 4, 5, 6
C_QUEUED_NS, C_STARTED_NS, C_FINISHED_NS, C_FAILED = 7, 8, 9, 10
# Step slot words.
S_VERSION, S_STEP, S_BEGIN_NS, S_READY_NS, S_FINALIZED_NS = 0, 1, 2, 3, 4

# Op values.
ALL_REDUCE, BROADCAST, ALL_GATHER, REDUCE_SCATTER, BARRIER = 1, 2, 3, 4, 5
REDUCE, GATHER, SCATTER, ALL_TO_ALL, SEND, RECV, OTHER, GRADIENTS = 6, 7, 8, 9, 10, 11, 12, 13


def pack_name(name):
    """Up to 8 bytes of `name`, first byte lowest, as the header's pack_name."""
    return int.from_bytes(name.encode()[:8].ljust(8, b"\0"), "little")


def _say(line):
    """One line on stderr, never raising (stderr may be closed)."""
    try:
        sys.stderr.write("ddprun: %s\n" % " ".join(str(line).split()))
        sys.stderr.flush()
    except Exception:
        pass


def _map_page(fd):
    """The page's words, or None when `fd` is not the agent's page in this process."""
    try:
        if not os.readlink("/proc/self/fd/%d" % fd).startswith("/memfd:"):
            return None
    except OSError:
        return None
    size = os.fstat(fd).st_size
    if size != PAGE_BYTES:
        raise RuntimeError("DDPRUN_RECORD_FD has %d bytes, expected %d" % (size, PAGE_BYTES))
    try:  # Python 3.13+: map without keeping a duplicate of the descriptor open
        page = mmap.mmap(fd, PAGE_BYTES, trackfd=False)
    except TypeError:
        page = mmap.mmap(fd, PAGE_BYTES)
    return memoryview(page).cast("Q")


# --- The recorder: every write to the page --------------------------------------------------


class Recorder:
    """Owns the page: every write to it. Thread-safe and cheap. Its callers catch what it
    raises (an internal error) and call stop()."""

    def __init__(self, words):
        self._words = words
        self._lock = _thread.allocate_lock()
        self.writing = False  # claimed, in the claiming process, not stopped: read lock-free
        self._pid = 0  # the claiming process
        self._refused = False  # the page belongs to another process, or we stopped
        self._queued = 0
        self._finished = 0
        self._finished_ahead = set()  # finished, but some earlier collective has not
        self._steps = 0

    # Claim and lifetime.

    def claim(self, rank, world_size, backend, timeout_ms):
        """Takes the page if no process has, and publishes it (once)."""
        with self._lock:
            w = self._words
            if self.writing or self._refused:
                return
            if w[PID] != 0:  # libddp or another process has it
                self._refused = True
                return
            self._pid = os.getpid()
            w[PID] = self._pid
            w[VERSION] = RECORD_VERSION
            w[RANK] = rank
            w[WORLD_SIZE] = world_size
            w[BACKEND] = pack_name(backend)
            w[WRITER] = pack_name("torch")
            w[TIMEOUT_MS] = timeout_ms
            w[CONTEXT] = 1
            w[LANE_STATE] = 1
            w[MAGIC] = RECORD_MAGIC
            self.writing = True

    def raise_timeout(self, timeout_ms):
        """The job's collective timeout: the largest of its process groups'."""
        if not self.writing or not self._mine():
            return
        with self._lock:
            if timeout_ms > self._words[TIMEOUT_MS]:
                self._words[TIMEOUT_MS] = timeout_ms

    def forked(self):
        """In a forked child: the page is the parent's. Never takes the lock, which the fork
        may have copied held."""
        self.writing = False
        self._refused = True

    def stop(self, error):
        """An internal error: says so once, unpublishes the page, and records nothing more."""
        was_writing = self.writing
        self.writing = False
        if self._refused:
            return
        self._refused = True
        if was_writing and self._pid == os.getpid():
            with self._lock:
                self._words[MAGIC] = 0
        _say("the Python probe stopped recording: %s: %s" % (type(error).__name__, error))

    def _mine(self):
        """Whether this process may write; the pid check catches forks that skipped
        os.register_at_fork (a fork from C that goes on running Python)."""
        if self._pid == os.getpid():
            return True
        self.forked()
        return False

    # Collectives.

    def queue(self, op, dtype, count, nbytes):
        """Records collective number queued+1 as issued now; returns its number, 0 when not
        recording. Its slot is reused only once the collective it held finished."""
        if not self.writing or not self._mine():
            return 0
        now = time.monotonic_ns()
        with self._lock:
            seq = self._queued + 1
            self._queued = seq
            w = self._words
            base = HEADER_WORDS + (seq % COLLECTIVE_SLOTS) * COLLECTIVE_WORDS
            if w[base + C_SEQ] == 0 or w[base + C_FINISHED_NS] != 0:
                version = w[base + C_VERSION]
                w[base + C_VERSION] = version + 1
                # seq .. failed; Python cannot see a start: started_ns is queued_ns.
                _SLOT_FIELDS.pack_into(w, (base + C_SEQ) * 8, seq, op, dtype, count, nbytes,
                                       NO_BUCKET, now, now, 0, 0)
                w[base + C_VERSION] = version + 2
            _TWO_WORDS.pack_into(w, QUEUED * 8, seq, seq)  # queued, started
        return seq

    def finish(self, seq, failed=False, communicator_failed=None):
        """Collective `seq` completed (failed: with an error). `finished` moves only over an
        unbroken run of finished numbers. communicator_failed (by default `failed`) sets the
        header's failed word too. (No pid check: a forked child has none of the threads that
        finish collectives, and queue() gave it no number.)"""
        if not seq or not self.writing:
            return
        if communicator_failed is None:
            communicator_failed = failed
        now = time.monotonic_ns()
        with self._lock:
            w = self._words
            base = HEADER_WORDS + (seq % COLLECTIVE_SLOTS) * COLLECTIVE_WORDS
            if w[base + C_SEQ] == seq:
                version = w[base + C_VERSION]
                w[base + C_VERSION] = version + 1
                _TWO_WORDS.pack_into(w, (base + C_FINISHED_NS) * 8, now, 1 if failed else 0)
                w[base + C_VERSION] = version + 2
            if communicator_failed:
                w[FAILED] = 1
            if seq != self._finished + 1:
                self._finished_ahead.add(seq)
                return
            ahead = self._finished_ahead
            while seq + 1 in ahead:
                seq += 1
                ahead.remove(seq)
            self._finished = seq
            _TWO_WORDS.pack_into(w, FINISHED * 8, seq, now)  # finished, last_finished_ns

    def future_done(self, seq, future):
        """A done callback for collective `seq`'s future (on any thread)."""
        try:
            failed = False
            try:
                future.value()
            except Exception:
                failed = True
            self.finish(seq, failed)
        except Exception as error:
            self.stop(error)

    # DDP steps.

    def begin_step(self, begin_ns):
        """Step steps+1 begins at begin_ns; returns its number, 0 when not recording."""
        if not self.writing or not self._mine():
            return 0
        with self._lock:
            step = self._steps + 1
            self._steps = step
            w = self._words
            base = STEP_BASE + (step % STEP_SLOTS) * STEP_WORDS
            w[base + S_VERSION] += 1
            w[base + S_STEP] = step
            w[base + S_BEGIN_NS] = begin_ns
            w[base + S_READY_NS] = 0
            w[base + S_FINALIZED_NS] = 0
            w[base + S_VERSION] += 1
            w[STEPS] = step
        return step

    def step_time(self, step, field, start_ns, now, total):
        """Step `step` reached `field` (S_READY_NS or S_FINALIZED_NS) at `now`; adds
        now - start_ns to header word `total`."""
        if not self.writing or not self._mine():
            return
        with self._lock:
            w = self._words
            base = STEP_BASE + (step % STEP_SLOTS) * STEP_WORDS
            if w[base + S_STEP] == step:
                w[base + S_VERSION] += 1
                w[base + field] = now
                w[base + S_VERSION] += 1
            w[total] += now - start_ns


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
    open_id = -1  # its op_id, in the group open_group stands for
    open_group = None  # a token of the group
    inside = False  # 1.13: inside a wrapped collective function (they call each other)
    last_step = None  # the _StepWatch of the last step this thread began


# --- PyTorch 2.14: the process groups' own hooks ---------------------------------------------

_HOOK_ID = 0x6464707275  # "ddpru": ours among a group's hooks

_HOOK_OPS = {  # HookOpName member name -> Op
    "ALLREDUCE": ALL_REDUCE, "BROADCAST": BROADCAST, "ALLGATHER": ALL_GATHER,
    "REDUCE_SCATTER": REDUCE_SCATTER, "BARRIER": BARRIER, "REDUCE": REDUCE,
    "GATHER": GATHER, "SCATTER": SCATTER, "ALLTOALL": ALL_TO_ALL, "SEND": SEND, "RECV": RECV,
}
_COUNT_OUTPUTS = (REDUCE_SCATTER, SCATTER, RECV)  # ops whose inputs are not what one rank sends


def _finish_when_done(recorder, seq, work):
    """Collective seq is finished when work's future completes (its callback runs on the
    backend's thread); at once when there is no work, or it has no future (Gloo's
    reduce_scatter: "not implemented")."""
    import functools

    future = None
    if work is not None:
        try:
            future = work.get_future()
        except (AttributeError, RuntimeError):
            pass
    if future is None:
        recorder.finish(seq)
    else:
        future.add_done_callback(functools.partial(recorder.future_done, seq))


def _hook_group(recorder, state, group, hook_op_name):
    """Registers ours as `group`'s pre and post hooks."""
    members = hook_op_name.__members__.values()
    ops = {member: _HOOK_OPS.get(member.name, OTHER) for member in members}
    token = object()  # this group, as a pair's key: the group itself would be a reference cycle
    # through C++ (the group holds the hooks) that keeps it alive after destroy_process_group

    def pre_hook(args):
        if not recorder.writing:
            return
        try:
            if state.open_seq:  # the last call on this thread raised before its post hook
                recorder.finish(state.open_seq, True, False)
            op = ops.get(args.name, OTHER)
            tensors = args.output_tensors if op in _COUNT_OUTPUTS else args.input_tensors
            state.open_seq = recorder.queue(op, *_measure(tensors))
            state.open_id = args.op_id
            state.open_group = token
        except Exception as error:
            recorder.stop(error)

    def post_hook(args):
        if not recorder.writing:
            return
        try:
            seq = state.open_seq
            if not seq or state.open_id != args.op_id or state.open_group is not token:
                return
            state.open_seq = 0
            state.open_group = None
            _finish_when_done(recorder, seq, args.work)
        except Exception as error:
            recorder.stop(error)

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


def _position(parameters, name):
    return parameters.index(name) if name in parameters else -1


def _wrap_collective(recorder, state, function, op, tensor_name, non_member):
    """`function` recording each call as one collective: finished when a synchronous call
    returns (failed if it raises), or when an asynchronous call's Work completes. Arguments and
    results pass through untouched."""
    import functools
    import inspect

    parameters = list(inspect.signature(function).parameters)
    tensor_at = _position(parameters, tensor_name)
    group_at = _position(parameters, "group")
    async_at = _position(parameters, "async_op")
    always_async = function.__name__ in _ALWAYS_ASYNC

    def argument(args, kwargs, at, name, default):
        return args[at] if 0 <= at < len(args) else kwargs.get(name, default)

    @functools.wraps(function)
    def collective(*args, **kwargs):
        if not recorder.writing or state.inside:
            return function(*args, **kwargs)
        seq = 0
        try:
            if argument(args, kwargs, group_at, "group", None) is not non_member:
                try:
                    size = _measure(argument(args, kwargs, tensor_at, tensor_name, None))
                except Exception:  # not tensors: the call itself will say so
                    size = (0, 0, 0)
                seq = recorder.queue(op, *size)
            is_async = always_async or argument(args, kwargs, async_at, "async_op", False)
        except Exception as error:
            recorder.stop(error)
            return function(*args, **kwargs)
        state.inside = True
        try:
            result = function(*args, **kwargs)
        except BaseException:
            try:
                recorder.finish(seq, True)  # a communication error, or the arguments'
            except Exception as error:
                recorder.stop(error)
            raise
        finally:
            state.inside = False
        try:
            _finish_when_done(recorder, seq, result if is_async and seq else None)
        except Exception as error:
            recorder.stop(error)
        return result

    return collective


def _wrap_functions(recorder, state, dist, c10d):
    """Wraps c10d's collective functions, in c10d (which calls them itself: all_gather_object
    calls all_gather) and in torch.distributed (which imported them by name)."""
    non_member = c10d.GroupMember.NON_GROUP_MEMBER
    for name, (op, tensor_name) in _FUNCTIONS.items():
        original = getattr(c10d, name, None)
        if original is None:
            continue
        wrapped = _wrap_collective(recorder, state, original, op, tensor_name, non_member)
        setattr(c10d, name, wrapped)
        if getattr(dist, name, None) is original:
            setattr(dist, name, wrapped)


# --- Process groups -----------------------------------------------------------------------------


def _backend_name(backend):
    """The backend's name from init_process_group's string: gloo of "gloo", nccl (the device
    backend) of "cpu:gloo,cuda:nccl"."""
    names = [entry.rpartition(":")[2] for entry in str(backend).lower().split(",")]
    return "nccl" if "nccl" in names else names[0]


def _timeout_ms(timeout):
    return int(timeout.total_seconds() * 1000) if timeout is not None else 0


def _watch_groups(recorder, state, dist, c10d):
    """Wraps _new_process_group_helper (every group: init_process_group's, new_group's) and
    split_group: the first group claims the page, and each gets our hooks where PyTorch has
    them."""
    import functools
    import inspect
    import weakref

    process_group = dist.ProcessGroup
    hooks = None
    if hasattr(process_group, "register_pre_hook"):
        hooks = sys.modules["torch._C._distributed_c10d"].HookOpName
        hooked = []  # weak references to the groups that hold our hooks
        atexit.register(_unhook_groups, hooked)

    def new_group(group, backend, timeout):
        if not isinstance(group, process_group):  # this rank is not a member
            return
        # The first group is the default one (init_process_group's): its rank is the global one.
        default = c10d._get_default_group() if c10d.is_initialized() else group
        recorder.claim(default.rank(), default.size(), _backend_name(backend), _timeout_ms(timeout))
        recorder.raise_timeout(_timeout_ms(timeout))
        if recorder.writing and hooks is not None:
            _hook_group(recorder, state, group, hooks)
            hooked.append(weakref.ref(group))

    helper = c10d._new_process_group_helper
    helper_signature = inspect.signature(helper)

    @functools.wraps(helper)
    def new_process_group_helper(*args, **kwargs):
        result = helper(*args, **kwargs)
        try:
            call = helper_signature.bind(*args, **kwargs)
            call.apply_defaults()
            group = result[0] if isinstance(result, tuple) else result  # 2.x: (group, store)
            new_group(group, call.arguments["backend"], call.arguments.get("timeout"))
        except Exception as error:
            recorder.stop(error)
        return result

    c10d._new_process_group_helper = new_process_group_helper

    split = getattr(c10d, "split_group", None)  # 2.x: groups split from a parent, no helper
    if split is None:
        return
    split_signature = inspect.signature(split)

    @functools.wraps(split)
    def split_group(*args, **kwargs):
        group = split(*args, **kwargs)
        try:
            timeout = split_signature.bind(*args, **kwargs).arguments.get("timeout")
            new_group(group, c10d.get_backend(group), timeout)
        except Exception as error:
            recorder.stop(error)
        return group

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

    def __init__(self, recorder, engine, step, begin_ns, gradients):
        self._recorder = recorder
        self._engine = engine
        self._step = step
        self._begin_ns = begin_ns
        self._ready_ns = 0
        self._gradients = gradients  # (dtype, count, bytes) to record as Op 13, or None
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
                self._seq = rec.queue(GRADIENTS, *self._gradients)
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
            rec.finish(seq)
        except Exception as error:
            self._recorder.stop(error)

    def abandon(self):
        """The thread began another step: if this backward began and never ended, it raised.
        Its Op 13 collective is closed as failed (the reduction never completed), lest
        `finished` stop there for good; the communicator is not known broken."""
        seq, self._seq = self._seq, 0
        self._recorder.finish(seq, True, False)


def _gradient_size(module, sizes):
    """(dtype, count, bytes) of the parameters of a DDP module that require grad, cached."""
    size = sizes.get(module)
    if size is None:
        size = sizes[module] = _measure([p for p in module.parameters() if p.requires_grad])
    return size


def _watch_steps(recorder, state, torch, ddp_class, with_gradients):
    """Wraps DistributedDataParallel.forward: a forward that will reduce gradients (grad enabled,
    outside no_sync) begins a step."""
    import functools
    import weakref

    forward = ddp_class.forward
    is_grad_enabled = torch.is_grad_enabled
    engine = torch.autograd.Variable._execution_engine
    sizes = weakref.WeakKeyDictionary()

    @functools.wraps(forward)
    def ddp_forward(self, *inputs, **kwargs):
        if not recorder.writing or not is_grad_enabled():
            return forward(self, *inputs, **kwargs)
        if not getattr(self, "require_backward_grad_sync", True):  # inside no_sync()
            return forward(self, *inputs, **kwargs)
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
        output = forward(self, *inputs, **kwargs)
        try:
            tensor = _first_tensor_requiring_grad(output) if step else None
            if tensor is not None:
                gradients = _gradient_size(self, sizes) if with_gradients else None
                state.last_step = watch = _StepWatch(recorder, engine, step, begin_ns, gradients)
                tensor.register_hook(watch.backward_began)
        except Exception as error:
            recorder.stop(error)
        return output

    ddp_class.forward = ddp_forward


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
        self.hooks = False  # the process groups have pre/post hooks (PyTorch 2.x)
        self.distributed = False  # torch.distributed is available and instrumented

    def on_distributed(self, dist):
        try:
            _drop_old_flight_recorder_names(sys.modules["torch"].__version__)
            if not dist.is_available():
                return
            c10d = sys.modules["torch.distributed.distributed_c10d"]
            self.hooks = hasattr(dist.ProcessGroup, "register_pre_hook")
            _watch_groups(self.recorder, self.state, dist, c10d)
            if not self.hooks:
                _wrap_functions(self.recorder, self.state, dist, c10d)
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
                _watch_steps(self.recorder, self.state, torch, module.DistributedDataParallel,
                             not self.hooks)
        except Exception as error:
            self.recorder.stop(error)


def _drop_old_flight_recorder_names(version):
    """ddprun sets PyTorch's Flight Recorder variables under both names (DDPRUN_FR_OLD_NAMES
    lists the old ones it set): a PyTorch that reads the TORCH_FR_ names (2.10 and later) warns
    on every rank that the old ones are deprecated, as torchrun's jobs never do. Drop them
    there, before the first process group reads them."""
    names = os.environ.pop("DDPRUN_FR_OLD_NAMES", "")
    numbers = version.split("+")[0].split(".")
    try:
        reads_new_names = (int(numbers[0]), int(numbers[1])) >= (2, 10)
    except (IndexError, ValueError):
        return
    if reads_new_names:
        for name in filter(None, names.split(",")):
            os.environ.pop(name, None)


# Header word 31 (the reserved area's last): the descriptor faulthandler writes stacks into.
STACK_FD = 31
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
    signal_text = os.environ.get("DDPRUN_STACK_SIGNAL")
    fd_text = os.environ.get("DDPRUN_STACK_FD")
    if not signal_text or not fd_text:
        return
    signal_number = int(signal_text)
    fd = _private_stack_fd(int(fd_text))
    if fd is None:
        return
    faulthandler.register(signal_number, file=fd, all_threads=True, chain=False)
    words[STACK_FD] = fd
    words[STACK_SIGNAL] = signal_number


def install():
    """Registers the stack signal and waits for torch.distributed. Does nothing without the
    agent's page; raises if the page or the variables are broken."""
    fd_text = os.environ.get("DDPRUN_RECORD_FD")
    if not fd_text:
        return
    words = _map_page(int(fd_text))
    if words is None or words[PID] != 0:  # not ours: inherited from the worker that ran us
        return
    _register_stack_signal(words)
    probe = _Probe(Recorder(words))
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
