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
"""

import os
import random
import socket
import sys
import threading
import time
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


def _rng_states():
    states = {"torch": torch.get_rng_state(), "python": random.getstate()}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        states["numpy"] = numpy.random.get_state()
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


class _Attempt:
    def __init__(self, job):
        self._job = job

    def __enter__(self):
        self._job._ready()
        return self._job

    def __exit__(self, kind, error, trace):
        if error is None or not self._job.recovers or not isinstance(error, Exception):
            return False
        if not is_lost_peer(error) and not self._job._announced():
            return False
        self._job.recover(error)
        return True


class Job:
    """One rank of a DDP job that recovers in place (the module's docstring shows its use).

    backend, timeout: as init_process_group takes them. recovery_timeout: how long a survivor
    waits for ddprun to start the next generation before it gives up (PeerLost)."""

    def __init__(self, backend=None, timeout=timedelta(minutes=30),
                 recovery_timeout=timedelta(seconds=60)):
        self.rank = int(os.environ["RANK"])
        self.world_size = int(os.environ["WORLD_SIZE"])
        self.step = 0  # steps committed
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
        self._committed_rng = None
        self._layout = None  # the DDP buckets to re-make (_bucket_layout)
        self._needs_state = False  # a replacement: the state comes from a survivor
        # The group's sockets ({fd: inode}) and their generation, shared with the watcher.
        self._joined = threading.Condition()
        self._sockets = {}
        self._sockets_generation = -1
        if not self.recovers:
            dist.init_process_group(backend, timeout=timeout)
            return
        restart_count = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        self._root = f"ddprun/inplace/{restart_count}/"
        self._store = self._connect()
        self._watch_store = self._connect()
        self._needs_state = self.generation > 0
        self._join()
        if not self._needs_state:
            self._mark_joined()
        watcher = threading.Thread(target=self._watch, name="ddprun-inplace", daemon=True)
        watcher.start()

    # --- what a training loop calls ---

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
        """Says that the step is done on this rank: job.step grows by one, and the random
        number generators' states are noted (a recovery restores them)."""
        self.step += 1
        if self.recovers:
            self._committed_rng = _rng_states()

    def recover(self, error=None):
        """Leaves the broken generation and joins the next: drops DDP, destroys the process
        group, waits for ddprun's next generation, forms it with the survivors and the
        replacement, and takes the state from the rank with the highest committed step.
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
            self._sockets = {}
            try:
                dist.destroy_process_group()
            except Exception:  # a group broken beyond destroying is left to the collector
                pass
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
        if self._needs_state:
            self._take_state()
            self._needs_state = False
            self._mark_joined()
        if self._ddp is None and self._module is not None:
            self._ddp = _make_ddp(self._module, self._ddp_options, self._layout)
        if self.recovers and self._committed_rng is None:
            self._committed_rng = _rng_states()

    def _take_state(self):
        """Every rank of the new generation runs this with the same collectives: the rank with
        the highest committed step (the lowest such rank) sends its state to all."""
        have = self._committed_rng is not None
        mine = torch.tensor([self.step if have else -1], dtype=torch.int64)
        device = self._device()
        steps = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(self.world_size)]
        dist.all_gather(steps, mine.to(device))
        steps = [int(t.item()) for t in steps]
        best = max(steps)
        if best < 0:
            return  # nobody holds state: every rank starts afresh
        source = steps.index(best)
        if self._module is not None:
            with torch.no_grad():
                for tensor in self._module.state_dict().values():
                    if isinstance(tensor, torch.Tensor):
                        dist.broadcast(tensor, source)
        names = sorted(self._kept)
        message = [None]
        if self.rank == source:
            message = [{"step": self.step, "rng": self._committed_rng, "layout": self._layout,
                        "kept": {name: self._kept[name].state_dict() for name in names}}]
        dist.broadcast_object_list(message, source, device=device)
        state = message[0]
        self.step = state["step"]
        self._layout = state["layout"]
        self._committed_rng = state["rng"]
        _set_rng_states(state["rng"])
        for name in names:
            if self.rank != source:
                self._kept[name].load_state_dict(state["kept"][name])

    def _device(self):
        if dist.get_backend() == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def _watch(self):
        """Frees this rank when it waits on a survivor that waits too: once ddprun begins the
        next generation, the old group's sockets are shut down, so that its collectives fail
        at once. Then waits for this rank to join that generation, and watches the next."""
        watched = self.generation
        while True:
            key = self._key(watched + 1, "announced")
            while True:
                try:
                    self._watch_store.wait([key], timedelta(hours=1))
                    break
                except Exception:
                    try:
                        if _has_key(self._watch_store, key):
                            break
                    except Exception:
                        return  # the store is gone: the job ends
            with self._joined:
                if self._sockets_generation == watched:
                    _shut_down(self._sockets)
                    self._sockets = {}
                watched += 1
                self._joined.wait_for(lambda: self._sockets_generation >= watched)
