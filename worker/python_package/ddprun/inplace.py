"""In-place recovery for PyTorch DDP programs: under ``ddprun --restart_policy=inplace``, when a
rank dies the others keep their processes and memory, ddprun starts one replacement for it, and
the job goes on from the last step that any rank committed (docs/inplace.md).

A training loop adopts it in a few lines::

    from ddprun import inplace

    job = inplace.Job("gloo")                  # the process group, in the current generation
    net = Net()
    job.wrap(net)                              # DDP around it: job.model
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    job.keep(optimizer=optimizer)              # what a replacement receives (the model's too)
    while job.step < steps:
        with job.attempt():                    # a lost peer: recover, then run this step again
            optimizer.zero_grad()
            loss_fn(job.model(inputs(job.step)), targets(job.step)).backward()
            optimizer.step()
            job.commit()                       # the step is done: job.step += 1

Under torchrun, or ddprun with another --restart_policy, the same program runs as a plain DDP
program: ``Job`` calls ``init_process_group`` as ``env://`` does, and an error propagates out of
``attempt()`` unchanged.

The protocol with ddprun (every key in the workers' store, at MASTER_ADDR:MASTER_PORT, under
``ddprun/inplace/<TORCHELASTIC_RESTART_COUNT>/``):
- ``DDPRUN_INPLACE_GENERATION`` (the environment): the generation a worker starts in; 0 for the
  round's first workers, G for a replacement. Unset: not under in-place recovery.
- ``g<G>/pg/``: the prefix of generation G's process group.
- ``g<G>/joined`` (a counter) and ``g<G>/done``: each rank adds one once it formed generation G
  and holds the job's state; the last sets ``done``. ddprun starts a recovery only from a
  generation that is done.
- ``g<G>/announced``: ddprun sets it (to the failed ranks) when generation G begins; the
  survivors wait for it, and their watcher uses it to free a survivor that waits on a survivor.
- ``left`` (a counter): each rank adds one as its program ends; ddprun then begins no
  generation (and stops waiting for one to form): that rank would never join it.
- ``g<G>/stuck``: a rank's watcher sets it (to a line saying why) when the rank cannot leave
  generation G-1's group; ddprun then falls back at once.
- ``rank<R>/s<S % 2>``: rank R's own state as of step S (its random number generators' states,
  and its buffers where they outlive the next forward), for its replacement.
"""

import atexit
import os
import pickle
import random
import socket
import struct
import sys
import threading
import time
import weakref
from datetime import timedelta

import torch
import torch.distributed as dist

GENERATION_VARIABLE = "DDPRUN_INPLACE_GENERATION"

# Words of the errors a collective raises when a peer is gone (Gloo, NCCL after an abort).
_LOST_WORDS = (
    "connection reset by peer",
    "connection closed by peer",
    "broken pipe",
    "connection refused",
    "socket closed",
    "remote process exited",
    "communicator was aborted",
    "ncclremoteerror",
    "nccl communicator",
    "aborted",
)


class PeerLost(RuntimeError):
    """A rank of this job's process group was lost, and this rank could not recover in place:
    not under ``--restart_policy=inplace``, or ddprun fell back to restarting every worker."""


def generation_from_environment():
    """The generation this worker starts in, or None when ddprun does not recover in place."""
    value = os.environ.get(GENERATION_VARIABLE)
    if value is None:
        return None
    try:
        generation = int(value)
    except ValueError:
        return None
    return generation if generation >= 0 else None


def is_lost_peer(error):
    """Whether error is what a collective raises when a peer of its group is gone."""
    if isinstance(error, PeerLost):
        return True
    network_error = getattr(dist, "DistNetworkError", None)
    if network_error is not None and isinstance(error, network_error):
        return True
    if not isinstance(error, RuntimeError):
        return False
    text = str(error).lower()
    return any(word in text for word in _LOST_WORDS)


def _socket_inodes():
    """{descriptor: socket inode} of this process's sockets."""
    found = {}
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return found
    for name in names:
        try:
            target = os.readlink("/proc/self/fd/" + name)
        except OSError:
            continue
        if target.startswith("socket:["):
            found[int(name)] = target
    return found


def _shut_down(descriptors):
    """Shuts down each socket of {fd: inode} that is still that socket: its process group's
    threads then fail at once ("Connection closed by peer") instead of waiting for a peer
    that waits too. The descriptors stay open: their owner closes them."""
    for fd, inode in descriptors.items():
        try:
            if os.readlink(f"/proc/self/fd/{fd}") != inode:
                continue
            sock = socket.socket(fileno=fd)
        except OSError:
            continue
        try:
            # A listening socket stays: its accept thread would fail (Gloo aborts on that).
            if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        finally:
            sock.detach()


# How long a collective that was running when its group's connections were shut may take to
# end before the watcher says this rank is stuck (such a collective fails within milliseconds).
_STUCK_SECONDS = 3.0


def _unfinished_collectives():
    """The collectives ddprun's probe saw this process issue and not finish; empty without it."""
    probe = sys.modules.get("_ddprun_probe")
    unfinished = getattr(probe, "unfinished_collectives", None)
    return unfinished() if unfinished is not None else frozenset()


def _has_key(store, key):
    """store.check([key]) where the store has it (PyTorch 2.x); else a wait that gives up at
    once (1.13's TCPStore has no check)."""
    if hasattr(store, "check"):
        return store.check([key])
    try:
        store.wait([key], timedelta(milliseconds=1))
        return True
    except Exception:
        return False


def _bucket_layout(ddp):
    """The parameter indices of each gradient bucket of a DDP module, once it has rebuilt its
    buckets in the order its gradients come (DDP's logging data), else None."""
    try:
        data = ddp._get_ddp_logging_data()
    except Exception:
        return None
    text = data.get("rebuilt_per_bucket_param_indices") if data.get("has_rebuilt_buckets") else None
    if not text:
        return None
    try:
        return [[int(index) for index in bucket.split()] for bucket in text.split(",")]
    except ValueError:
        return None


def _make_ddp(module, options, layout):
    """DistributedDataParallel(module, **options), its buckets laid out as `layout` says when
    given: the layout the job's DDP had rebuilt before the failure, on every rank, so that the
    gradients are summed in the same order as in a run without the failure."""
    ddp_class = torch.nn.parallel.DistributedDataParallel
    count = sum(1 for p in module.parameters() if p.requires_grad)
    if layout is None or sorted(i for bucket in layout for i in bucket) != list(range(count)):
        return ddp_class(module, **options)
    original = dist._compute_bucket_assignment_by_size

    def assignment(parameters, limits, *rest, **named):
        buckets = [list(bucket) for bucket in layout]
        return list(reversed(buckets)), [limits[-1]] * len(buckets)  # DDP reverses them

    dist._compute_bucket_assignment_by_size = assignment
    try:
        return ddp_class(module, **options)
    finally:
        dist._compute_bucket_assignment_by_size = original


def _numpy_state(numpy):
    """numpy's global generator's state: the legacy tuple for MT19937 (its default), else
    its BitGenerator's dict (get_state would warn in the program's output)."""
    bits = getattr(getattr(numpy.random.mtrand, "_rand", None), "_bit_generator", None)
    if bits is None or type(bits).__name__ == "MT19937":
        return numpy.random.get_state()
    return numpy.random.get_state(legacy=False)


def _rng_states():
    states = {"torch": torch.get_rng_state(), "python": random.getstate()}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        states["numpy"] = _numpy_state(numpy)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def _set_rng_states(states):
    torch.set_rng_state(states["torch"])
    random.setstate(states["python"])
    numpy = sys.modules.get("numpy")
    if numpy is not None and "numpy" in states:
        numpy.random.set_state(states["numpy"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def _copies(tensors, into=None):
    """Copies of tensors (detached), into the tensors of `into` where their shapes allow."""
    if into is None or len(into) != len(tensors):
        return [t.detach().clone() for t in tensors]
    for saved, tensor in zip(into, tensors):
        if saved.shape != tensor.shape or saved.dtype != tensor.dtype or \
                saved.device != tensor.device:
            return [t.detach().clone() for t in tensors]
    with torch.no_grad():
        if into and hasattr(torch, "_foreach_copy_"):  # 2.x: one call (3 per BatchNorm)
            torch._foreach_copy_(into, tensors)
        else:
            for saved, tensor in zip(into, tensors):
                saved.copy_(tensor)
    return into


def _tensor_bytes(tensor):
    if tensor.device.type != "cpu" or tensor.requires_grad or not tensor.is_contiguous():
        tensor = tensor.detach().cpu().contiguous()
    try:
        data = tensor.numpy().tobytes()
    except TypeError:  # a dtype numpy lacks (bfloat16): its bytes as they are
        data = tensor.reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b""
    return (str(tensor.dtype).replace("torch.", ""), tuple(tensor.shape), data)


def _tensor_from(encoded, device=None):
    dtype, shape, data = encoded
    dtype = getattr(torch, dtype)
    if not data:
        return torch.empty(shape, dtype=dtype, device=device)
    flat = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype)
    return flat.reshape(shape).to(device) if device is not None else flat.reshape(shape)


class _Encoder:
    """Encodes a rank's own state as of a step (what its replacement continues) as bytes. The
    Python and numpy generators' states rarely change from step to step (a training loop draws
    from torch's): their encoding is kept and used again while they are equal."""

    def __init__(self):
        self._python = (None, None)  # (state, its pickle)
        self._numpy = (None, None)

    def _cached(self, slot, state, equal):
        held, encoded = getattr(self, slot)
        if held is None or not equal(held, state):
            encoded = pickle.dumps(state, protocol=4)
            setattr(self, slot, (state, encoded))
        return encoded

    def encode(self, step, rng, buffers):
        record = {"step": step, "torch": _tensor_bytes(rng["torch"]),
                  "python": self._cached("_python", rng["python"], lambda a, b: a == b)}
        if "numpy" in rng:
            record["numpy"] = self._cached("_numpy", rng["numpy"], _same_numpy_state)
        if "cuda" in rng:
            record["cuda"] = [_tensor_bytes(t) for t in rng["cuda"]]
        record["buffers"] = None if buffers is None else [_tensor_bytes(b) for b in buffers]
        return pickle.dumps(record, protocol=4)


def _same_numpy_state(a, b):
    """Whether two of _numpy_state's states are equal: MT19937's legacy tuples (an array in
    them), or another generator's dicts (plain values)."""
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and a[0] == b[0] and a[2:] == b[2:] and (a[1] == b[1]).all()
    return type(a) is type(b) and a == b


def _decode_record(data):
    record = pickle.loads(data)
    rng = {"torch": _tensor_from(record["torch"]), "python": pickle.loads(record["python"])}
    if "numpy" in record:
        rng["numpy"] = pickle.loads(record["numpy"])
    if "cuda" in record:
        rng["cuda"] = [_tensor_from(t) for t in record["cuda"]]
    buffers = record["buffers"]
    return {"step": record["step"], "rng": rng,
            "buffers": None if buffers is None else [_tensor_from(b) for b in buffers]}


class _Attempt:
    def __init__(self, job):
        self._job = job

    def __enter__(self):
        self._job._ready()
        return self._job

    def __exit__(self, kind, error, trace):
        if error is None:
            return False
        self._job._clean = False  # until it recovers: a step left half done
        if not self._job.recovers or not isinstance(error, Exception):
            return False
        if not is_lost_peer(error) and not self._job._announced():
            return False
        self._job.recover(error)
        self._job._clean = True
        return True


class _Record:
    """A rank's own state as of a committed step: its random number generators' states and its
    model's buffers (BatchNorm's running statistics), which differ from rank to rank."""

    __slots__ = ("rng", "buffers", "published")

    def __init__(self, rng, buffers):
        self.rng = rng
        self.buffers = buffers
        self.published = False


class Job:
    """One rank of a DDP job that recovers in place (the module's docstring shows its use).

    backend, timeout: as init_process_group takes them. recovery_timeout: how long a survivor
    waits for ddprun to start the next generation before it gives up (PeerLost).
    checkpoint_dir, every: the job's own checkpoint, for a restart of every worker (a fallback,
    or torchrun's restart): every `every` committed steps, and when the program ends between
    steps, each rank writes the state under checkpoint_dir (a folder every rank reaches); a job
    that starts again goes on from the newest checkpoint that every rank completed."""

    def __init__(self, backend=None, timeout=timedelta(minutes=30),
                 recovery_timeout=timedelta(seconds=60), checkpoint_dir=None, every=100):
        self.rank = int(os.environ["RANK"])
        self.world_size = int(os.environ["WORLD_SIZE"])
        self._step = 0  # steps committed
        self.generation = generation_from_environment()
        self.recovers = self.generation is not None
        self.recoveries = 0  # recoveries this process took part in
        self.last_recovery_seconds = None  # from the lost peer to the state in hand
        self.last_lost_time = None  # time.time() when this rank last saw a peer lost
        self._backend = backend
        self._timeout = timeout
        self._recovery_timeout = recovery_timeout
        self._module = None
        self._ddp = None
        self._ddp_options = {}
        self._kept = {}
        self._records = {}  # step -> _Record: this rank's own state as of that step
        self._encoder = _Encoder()
        self._buffer_list = None  # the module's buffers, as of the current DDP's making
        self._kept_states = {}  # name -> state_dict() at the last commit (optimizers aside)
        self._has_state = False  # holds the job's state (a replacement: once it received it)
        self._layout = None  # the DDP buckets to re-make (_bucket_layout)
        self._needs_state = False  # a replacement: the state comes from a survivor
        self._clean = True  # no step failed unrecovered: the state is that of a commit
        self._checkpoint = _Checkpoints(checkpoint_dir, every, self.rank, self.world_size) \
            if checkpoint_dir else None
        self._resume_pending = self._checkpoint is not None and not self.generation
        # The group's sockets ({fd: inode}) and their generation, shared with the watcher.
        self._joined = threading.Condition()
        self._sockets = {}
        self._sockets_generation = -1
        self._left_generation = -1  # the last generation whose group this rank destroyed
        self._watcher = None
        self._waiter = None  # the watcher's connection to the store
        self._stopping = False
        atexit.register(self._at_exit)
        if not self.recovers:
            dist.init_process_group(backend, timeout=timeout)
            return
        restart_count = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        self._root = f"ddprun/inplace/{restart_count}/"
        self._store = self._connect()
        self._waiter = _Connection(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
        self._needs_state = self.generation > 0
        self._join()
        if not self._needs_state:
            self._mark_joined()
        self._watcher = threading.Thread(target=self._watch, name="ddprun-inplace", daemon=True)
        self._watcher.start()

    # --- what a training loop calls ---

    @property
    def step(self):
        """Steps committed: the step the loop runs next. A job that starts again from its
        checkpoint (checkpoint_dir) has it from there."""
        if self._resume_pending and self._module is not None:
            self._resume()
        return self._step

    @step.setter
    def step(self, value):
        self._resume_pending = False
        self._step = value

    def wrap(self, module, **ddp_options):
        """Wraps module in DistributedDataParallel (job.model, re-made after each recovery); its
        parameters and buffers are part of the state a replacement receives."""
        self._module = module
        self._ddp_options = ddp_options
        self._ddp = None

    @property
    def model(self):
        """The DDP module of the current generation."""
        self._ready()
        return self._ddp

    @property
    def module(self):
        return self._module

    def keep(self, **states):
        """Registers state a replacement receives from a survivor: each value is an object with
        state_dict() and load_state_dict() (an optimizer, an LR scheduler, a sampler). The
        model's parameters and buffers, the step, and the random number generators' states
        (torch, random, numpy, CUDA) are kept without asking."""
        self._kept.update(states)

    def attempt(self):
        """A context for one step: when a peer is lost inside it (under --restart_policy=inplace)
        this rank recovers and the context swallows the error; the loop then runs job.step
        again. Otherwise the error propagates as it is."""
        return _Attempt(self)

    def commit(self):
        """Says that the step is done on this rank: job.step grows by one, and this rank's state
        as of the step is noted (a recovery goes back to it)."""
        self._step += 1
        if self.recovers:
            self._note(self._step, publish=True, at_commit=True)
            if self._kept:
                self._kept_states = {name: obj.state_dict() for name, obj in self._kept.items()
                                     if not isinstance(obj, torch.optim.Optimizer)}
        if self._checkpoint is not None and self._step % self._checkpoint.every == 0:
            self._save_checkpoint()

    def recover(self, error=None):
        """Leaves the broken generation and joins the next: drops DDP, destroys the process
        group, waits for ddprun's next generation, forms it with the survivors and the
        replacement, and goes back to the state of the highest step a rank committed.
        Raises PeerLost (from error) when this rank cannot recover in place."""
        if not self.recovers:
            raise PeerLost(f"rank {self.rank} lost a peer: {error}") from error
        started = time.monotonic()
        self.last_lost_time = time.time()
        next_generation = self.generation + 1
        if self._ddp is not None:  # a DDP that has not rebuilt its buckets yet has ours
            self._layout = _bucket_layout(self._ddp) or self._layout
        self._ddp = None
        with self._joined:
            # Shut first: destroying a group waits for its queued collectives, which then
            # fail at once (the watcher may not have woken yet).
            _shut_down(self._sockets)
            self._sockets = {}
        try:
            dist.destroy_process_group()
        except Exception:  # a group broken beyond destroying is left to the collector
            pass
        with self._joined:
            self._left_generation = self.generation
        try:
            self._store.wait([self._key(next_generation, "announced")], self._recovery_timeout)
        except Exception as waited:
            raise PeerLost(
                f"rank {self.rank} lost a peer, and ddprun started no generation "
                f"{next_generation} within {self._recovery_timeout.total_seconds():g} s "
                f"({waited}): the job cannot recover in place") from error
        self.generation = next_generation
        self._join()
        self._needs_state = True
        self._ready()
        self.recoveries += 1
        self.last_recovery_seconds = time.monotonic() - started

    # --- inside ---

    def _connect(self):
        return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                             is_master=False, timeout=self._timeout)

    def _key(self, generation, name):
        return f"{self._root}g{generation}/{name}"

    def _record_key(self, rank, step):
        return f"{self._root}rank{rank}/s{step % 2}"

    def _announced(self):
        """Whether ddprun already began the generation after this one (a peer is lost)."""
        if not self.recovers:
            return False
        try:
            return _has_key(self._store, self._key(self.generation + 1, "announced"))
        except Exception:
            return False

    def _join(self):
        """Forms this generation's process group; notes its sockets for the watcher."""
        before = _socket_inodes()
        store = dist.PrefixStore(self._key(self.generation, "pg/"), self._store)
        dist.init_process_group(self._backend, store=store, rank=self.rank,
                                world_size=self.world_size, timeout=self._timeout)
        after = _socket_inodes()
        with self._joined:
            self._sockets = {fd: inode for fd, inode in after.items()
                             if before.get(fd) != inode}
            self._sockets_generation = self.generation
            self._joined.notify_all()

    def _mark_joined(self):
        joined = self._store.add(self._key(self.generation, "joined"), 1)
        if joined == self.world_size:
            self._store.set(self._key(self.generation, "done"), str(self.generation))

    def _ready(self):
        """Takes the state when it must come from a survivor, and makes the DDP module."""
        if self._ddp is not None and self._has_state and not self._needs_state and \
                not self._resume_pending:
            return  # each step's case: nothing to do
        if self._resume_pending and self._module is not None:
            self._resume()
        if self._needs_state:
            self._take_state()
            self._needs_state = False
            self._mark_joined()
        if self._ddp is None and self._module is not None:
            self._ddp = _make_ddp(self._module, self._ddp_options, self._layout)
            self._buffer_list = None
            if self.recovers:
                self._note_forwards(self._ddp)
                # DDP's construction gave every rank rank 0's buffers: after a recovery,
                # this rank's own go back (a forward would give them rank 0's again only
                # where DDP broadcasts its buffers).
                record = self._records.get(self._step)
                if record is not None:
                    with torch.no_grad():
                        for tensor, saved in zip(self._buffers(), record.buffers):
                            tensor.copy_(saved)
        if not self._has_state:
            self._has_state = True
            if self.recovers:
                self._note(self._step, publish=True)

    # Each rank's own state as of a step: kept here for the last two steps, and published in
    # the workers' store, where a replacement finds the state of the rank it replaces. A
    # rank's state as of step S+1 is what it holds after the last forward of step S that
    # precedes the step's gradient all-reduce (BatchNorm updates its statistics and Dropout
    # draws in the forward): it is published then, before the all-reduce, because a rank may
    # die after its part of the all-reduce but before its commit while the others commit S+1.
    # commit() notes it again, and publishes it again where it changed since the forward.

    def _buffers(self):
        return list(self._module.buffers()) if self._module is not None else []

    def _step_buffers(self):
        """The module's buffers, listed once per DDP module (a step updates them in place;
        BatchNorm does)."""
        if self._ddp is None:
            return self._buffers()
        if self._buffer_list is None:
            self._buffer_list = self._buffers()
        return self._buffer_list

    def _publishes_buffers(self):
        """Whether this rank's buffers outlive the next forward: DDP broadcasts rank 0's
        buffers at the start of each forward (broadcast_buffers, its default)."""
        return self.rank == 0 or not self._ddp_options.get("broadcast_buffers", True)

    def _note_forwards(self, ddp):
        """Notes this rank's state at the end of each of ddp's forwards that an all-reduce
        follows. Through its forward itself rather than a forward hook: a module with hooks
        takes PyTorch's slow call path (about 60 us a call on 2.14)."""
        forward = type(ddp).forward
        held = weakref.ref(ddp)  # no cycle: a dropped DDP (and its group) goes at once

        def forward_noted(*args, **kwargs):
            module = held()
            output = forward(module, *args, **kwargs)
            if torch.is_grad_enabled() and module.training and \
                    getattr(module, "require_backward_grad_sync", True):
                self._note(self._step + 1, publish=True)
            # else no all-reduce follows (evaluation, or no_sync()'s accumulation)
            return output

        ddp.forward = forward_noted

    def _note(self, step, publish, at_commit=False):
        old = self._records.pop(step - 2, None)
        previous = self._records.get(step)
        if at_commit and previous is not None and previous.published and \
                torch.equal(previous.rng["torch"], torch.get_rng_state()) and \
                previous.rng["python"] == random.getstate():
            # The forward's note holds: nothing drew from torch's or Python's generator since
            # (buffers change in a forward, which notes again; numpy's generator is taken to
            # draw before the forward, as a data pipeline's does: docs/inplace.md).
            return
        rng = _rng_states()
        reuse = previous.buffers if previous is not None else (old.buffers if old else None)
        current = self._step_buffers()
        record = _Record(rng, _copies(current, reuse))
        self._records[step] = record
        if publish:
            buffers = record.buffers if self._publishes_buffers() else None
            try:
                self._store.set(self._record_key(self.rank, step),
                                self._encoder.encode(step, rng, buffers))
                record.published = True
            except Exception:  # the store is gone: the job's end, or the failure says so
                pass

    def _published_record(self, step):
        """The record this rank's predecessor published for step, or None."""
        for parity in (0, 1):
            key = f"{self._root}rank{self.rank}/s{parity}"
            try:
                if not _has_key(self._store, key):
                    continue
                record = _decode_record(self._store.get(key))
            except Exception:
                continue
            if record["step"] == step:
                return record
        return None

    def _take_state(self):
        """Every rank of the new generation runs this with the same collectives: the rank with
        the highest committed step (the lowest such rank) sends the job's state to all; each
        rank then goes back to its own state as of that step (its random number generators and
        buffers), a replacement to the one its predecessor published."""
        have = self._has_state
        mine = torch.tensor([self._step if have else -1], dtype=torch.int64)
        device = self._device()
        steps = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(self.world_size)]
        dist.all_gather(steps, mine.to(device))
        steps = [int(t.item()) for t in steps]
        best = max(steps)
        if best < 0:
            return  # nobody holds state: every rank starts afresh
        source = steps.index(best)
        own = self._records.get(best) if have else None
        published = None if own is not None else self._published_record(best)
        buffers = self._buffers()
        if own is not None and self._module is not None:
            with torch.no_grad():  # what this step's forward changed goes
                for tensor, saved in zip(buffers, own.buffers):
                    tensor.copy_(saved)
        if self._module is not None:
            with torch.no_grad():
                for tensor in self._module.state_dict().values():
                    if isinstance(tensor, torch.Tensor):
                        dist.broadcast(tensor, source)
                for parameter in self._module.parameters():
                    parameter.grad = None  # what the failed step accumulated goes too
        names = sorted(self._kept)
        message = [None]
        if self.rank == source:
            kept = {name: self._kept_states.get(name) or self._kept[name].state_dict()
                    for name in names}
            message = [{"step": self._step, "rng": own.rng if own else _rng_states(),
                        "layout": self._layout,
                        "kept": kept}]
        dist.broadcast_object_list(message, source, device=device)
        state = message[0]
        self._step = state["step"]
        self._layout = state["layout"]
        for name in names:
            obj = self._kept[name]
            if self.rank != source or not isinstance(obj, torch.optim.Optimizer):
                obj.load_state_dict(state["kept"][name])
        if own is not None:
            rng, saved = own.rng, own.buffers
        elif published is not None:
            rng, saved = published["rng"], published["buffers"]
        else:
            rng, saved = state["rng"], None
            sys.stderr.write(
                f"ddprun.inplace: rank {self.rank} continues rank {source}'s random number "
                f"streams: its predecessor's states as of step {best} were not found\n")
        if saved is not None and self._module is not None:
            with torch.no_grad():
                for tensor, value in zip(buffers, saved):
                    tensor.copy_(value)
        _set_rng_states(rng)
        self._records = {best: _Record(rng, _copies(buffers))}
        self._has_state = True
        if own is None:
            self._note(best, publish=True)

    def _device(self):
        if dist.get_backend() == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    # --- the job's own checkpoint ---

    def _save_checkpoint(self):
        module = self._module.state_dict() if self._module is not None else None
        shared = None
        if self.rank == 0:
            shared = {"model": module, "layout": self._layout,
                      "kept": {name: obj.state_dict() for name, obj in self._kept.items()}}
        record = self._records.get(self._step)  # as of the commit, not of a failed step
        rng = record.rng if record is not None else _rng_states()
        buffers = record.buffers if record is not None else self._buffers()
        own = {"rng": rng, "buffers": [b.detach().cpu() for b in buffers]}
        self._checkpoint.save(self._step, shared, own)

    def _resume(self):
        """Goes on from the newest complete checkpoint, if there is one."""
        self._resume_pending = False
        found = self._checkpoint.load()
        if found is None:
            return
        step, shared, own = found
        if self._module is not None and shared["model"] is not None:
            self._module.load_state_dict(shared["model"])
        for name, obj in self._kept.items():
            if name in shared["kept"]:
                obj.load_state_dict(shared["kept"][name])
        self._layout = shared["layout"]
        if own is not None:
            _set_rng_states(own["rng"])
            with torch.no_grad():
                for tensor, value in zip(self._buffers(), own["buffers"]):
                    tensor.copy_(value)
            # This rank's own buffers, which making DDP replaces with rank 0's, come back then.
            self._records = {step: _Record(own["rng"], _copies(self._buffers()))}
        self._step = step
        if self.rank == 0:
            sys.stderr.write(f"ddprun.inplace: going on from the checkpoint of step {step} "
                             f"({self._checkpoint.folder(step)})\n")

    def _at_exit(self):
        """At the program's end: a checkpoint of the last step (when the program ends between
        steps), a word to ddprun that this rank cannot join a later generation, and the
        watcher stopped before the interpreter finalizes (a thread that wakes in a C++ call
        then would abort the process)."""
        self._stopping = True
        if self._checkpoint is not None and self._clean and self._has_state and \
                self._step > self._checkpoint.saved:
            try:
                self._save_checkpoint()
            except Exception as e:
                sys.stderr.write(f"ddprun.inplace: rank {self.rank} could not write the "
                                 f"checkpoint of step {self._step}: {e}\n")
        if not self.recovers:
            return
        try:
            self._store.set_timeout(timedelta(seconds=5))
            self._store.add(f"{self._root}left", 1)
        except Exception:
            pass
        if self._waiter is not None:
            self._waiter.close()
        if self._watcher is not None:
            self._watcher.join(5)

    def _watch(self):
        """Frees this rank when it waits on a survivor that waits too: once ddprun begins the
        next generation, the old group's sockets are shut down, so that its collectives fail
        at once. Then waits for this rank to join that generation, and watches the next."""
        watched = self.generation
        while True:
            try:
                self._waiter.wait(self._key(watched + 1, "announced"))
            except OSError:
                return  # the store is gone (the job ends), or this rank's program ends
            if self._stopping:
                return
            with self._joined:
                stuck_check = None
                if self._sockets_generation == watched:
                    _shut_down(self._sockets)
                    self._sockets = {}
                    if self._left_generation < watched:
                        pending = _unfinished_collectives()
                        if pending:
                            stuck_check = (time.monotonic() + _STUCK_SECONDS, pending)
                watched += 1
                while self._sockets_generation < watched and not self._stopping:
                    self._joined.wait(0.25 if stuck_check else 1.0)
                    if stuck_check and time.monotonic() >= stuck_check[0]:
                        if self._left_generation < watched - 1 and \
                                stuck_check[1] & _unfinished_collectives():
                            self._say_stuck(watched)
                        stuck_check = None
            if self._stopping:
                return

    def _say_stuck(self, generation):
        """Tells ddprun that this rank cannot leave generation-1's group: a collective it was
        in when that group's connections were shut has not ended (one that does not wait on
        those connections, or a backend that does not notice). ddprun falls back at once,
        rather than wait for generation to form until its limit."""
        try:
            self._waiter.set(self._key(generation, "stuck"),
                             f"rank {self.rank} is still in a collective of generation "
                             f"{generation - 1} {_STUCK_SECONDS:g} s after that group's "
                             f"connections were shut (a collective that does not end on them)")
        except OSError:
            pass


class _Connection:
    """A plain-Python connection to the workers' store, speaking the TCPStore protocol of the
    PyTorch it runs with. The watcher waits through one for a key with no timeout: close()
    then ends its wait in silence (PyTorch's client prints a stack when its connection
    closes), and a wait that returns as the interpreter finalizes ends the thread as any
    Python thread's (a C++ call then aborts the process)."""

    _MAGIC = 0x3C85F7CE  # 2.x: the VALIDATE a connection opens with

    def __init__(self, host, port):
        self._socket = socket.create_connection((host, port))
        self._socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._v2 = int(torch.__version__.split(".")[0]) >= 2
        if self._v2:
            self._socket.sendall(bytes([0]) + struct.pack("<I", self._MAGIC))
        self._closed = False

    def wait(self, key):
        """Returns once key exists; OSError when the connection ends."""
        name = ("/" + key).encode()  # as PyTorch's client writes a program's key
        command = 6 if self._v2 else 5  # WAIT
        self._socket.sendall(bytes([command]) + struct.pack("<QQ", 1, len(name)) + name)
        reply = self._socket.recv(1)
        if reply != b"\x00":
            raise ConnectionError(f"the workers' store answered {reply!r} to a wait")

    def set(self, key, value):
        """Sets key to value (bytes, or a str); no reply comes."""
        name = ("/" + key).encode()
        data = value.encode() if isinstance(value, str) else value
        command = 1 if self._v2 else 0  # SET
        self._socket.sendall(bytes([command]) + struct.pack("<Q", len(name)) + name +
                             struct.pack("<Q", len(data)) + data)

    def close(self):
        if self._closed:
            return
        self._closed = True
        try:
            self._socket.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _load(path):
    """torch.load of one of the job's own checkpoint files, which hold the random number
    generators' states (numpy's: not weights, so PyTorch 2.6+ needs weights_only=False)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except TypeError:  # a PyTorch without weights_only
        return torch.load(path, map_location="cpu")


class _Checkpoints:
    """The job's checkpoints: <folder>/step-<S>/shared.pt (rank 0: the model, what keep()
    registered, DDP's bucket layout) and rank-<R>.pt (each rank's random number generators'
    states and buffers). A checkpoint is complete when all of them are there; each rank keeps
    its files of its last two checkpoints."""

    def __init__(self, folder, every, rank, world_size):
        if every is None or int(every) < 1:
            raise ValueError(f"every must be a positive number of steps (not {every!r})")
        self.root = os.fspath(folder)
        self.every = int(every)
        self.rank = rank
        self.world_size = world_size
        self.saved = -1  # the last step this rank saved
        self._mine = []  # this rank's checkpoints' steps, oldest first

    def folder(self, step):
        return os.path.join(self.root, f"step-{step}")

    def _write(self, path, value):
        temporary = f"{path}.tmp.{os.getpid()}"
        torch.save(value, temporary)
        os.replace(temporary, path)

    def save(self, step, shared, own):
        folder = self.folder(step)
        os.makedirs(folder, exist_ok=True)
        if shared is not None:
            self._write(os.path.join(folder, "shared.pt"), dict(shared, step=step))
        self._write(os.path.join(folder, f"rank-{self.rank}.pt"), dict(own, step=step))
        self.saved = step
        self._mine.append(step)
        for old in self._mine[:-2]:
            for name in ("shared.pt", f"rank-{self.rank}.pt"):
                try:
                    os.unlink(os.path.join(self.folder(old), name))
                except OSError:
                    pass
            try:
                os.rmdir(self.folder(old))
            except OSError:
                pass  # another rank's file is still there
        self._mine = self._mine[-2:]

    def _complete(self):
        """The steps of complete checkpoints, newest first."""
        try:
            names = os.listdir(self.root)
        except OSError:
            return []
        steps = []
        for name in names:
            if not name.startswith("step-") or not name[5:].isdigit():
                continue
            folder = os.path.join(self.root, name)
            wanted = ["shared.pt"] + [f"rank-{r}.pt" for r in range(self.world_size)]
            if all(os.path.exists(os.path.join(folder, w)) for w in wanted):
                steps.append(int(name[5:]))
        return sorted(steps, reverse=True)

    def load(self):
        """(step, shared, this rank's) of the newest complete checkpoint, or None."""
        for step in self._complete():
            folder = self.folder(step)
            try:
                shared = _load(os.path.join(folder, "shared.pt"))
                own = _load(os.path.join(folder, f"rank-{self.rank}.pt"))
            except Exception as e:  # removed meanwhile, or unreadable: the one before
                sys.stderr.write(f"ddprun.inplace: rank {self.rank} cannot read the checkpoint "
                                 f"{folder} ({e}); trying an older one\n")
                continue
            self.saved = step
            self._mine = [step]
            return step, shared, own
        return None
