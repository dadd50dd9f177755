"""The writer side of ddprun's record page for the Python probe (_ddprun_probe.py, beside this
file): the page's layout (common/include/ddp/common/collective_record.hpp; the checks in
tests/worker/python/probe_check.py read it from there) and the Recorder, which makes
every write to it. Imports nothing of torch."""

import _thread
import mmap
import os
import struct
import sys
import time

# --- The page (collective_record.hpp) --------------------------------------------------------

RECORD_MAGIC = 0x3130434552504444  # "DDPREC01"
RECORD_VERSION = 2
HEADER_WORDS = 32
COLLECTIVE_SLOTS = 256
COLLECTIVE_WORDS = 16
STEP_SLOTS = 64
STEP_WORDS = 8
STEP_BASE = HEADER_WORDS + COLLECTIVE_SLOTS * COLLECTIVE_WORDS
# Lanes 1..3 (a 16-word header and a ring each): libddp's other communicators, the probe's
# other process groups.
EXTRA_LANES = 3
LANE_WORDS = 16 + COLLECTIVE_SLOTS * COLLECTIVE_WORDS
PAGE_BYTES = (STEP_BASE + STEP_SLOTS * STEP_WORDS + EXTRA_LANES * LANE_WORDS) * 8  # 135808
NO_BUCKET = 0xFFFFFFFFFFFFFFFF
# Adjacent words written in one call; native format: each word is one aligned 8-byte store.
_SLOT_FIELDS = struct.Struct("10Q")  # a collective slot's seq .. failed
_TWO_WORDS = struct.Struct("2Q")
_P2P_FIELDS = struct.Struct("4Q")  # a lane's p2p since .. peer

# Header words.
MAGIC, VERSION, PID, RANK, WORLD_SIZE, BACKEND = 0, 1, 2, 3, 4, 5
QUEUED, STARTED, FINISHED, LAST_FINISHED_NS, FAILED = 6, 7, 8, 9, 10
STEPS, COMPUTE_NS_TOTAL, WAIT_NS_TOTAL = 11, 12, 13
WRITER, STACK_SIGNAL, TIMEOUT_MS = 15, 16, 17
LANE_STATE, CONTEXT = 18, 19  # lane 0's state and which process group it records
LANE0_EXTRA = 26  # lane 0's unrecorded and p2p words (X_*): header words 26-30
# Lanes 1..: a 16-word header (LaneHeader) and a ring each, after the steps.
LANES_BASE = STEP_BASE + STEP_SLOTS * STEP_WORDS
L_STATE, L_CONTEXT, L_BACKEND, L_RANK, L_WORLD_SIZE, L_TIMEOUT_MS = 0, 1, 2, 3, 4, 5
L_QUEUED, L_EXTRA = 6, 11  # queued, started, finished, last_finished_ns, failed; the X_ words
LANE_OPEN, LANE_CLAIMING = 1, 3
# A lane's extra words, from its `extra`: collectives left unrecorded (issued by a signal handler
# while its thread recorded), and the oldest send or recv a thread waits in (since 0: none).
X_UNRECORDED, X_P2P_SINCE_NS, X_P2P_OP, X_P2P_BYTES, X_P2P_PEER = 0, 1, 2, 3, 4
NO_PEER = 0xFFFFFFFFFFFFFFFF
# A process group's context: its name's number + 1 (c10d names groups "0", "1"... in the order
# every rank makes them), else HASHED_CONTEXT | 62 bits of the name's hash.
HASHED_CONTEXT = 1 << 62
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


class _Lane:
    """One process group's lane of the page: where its words are, and its numbering. Lane 0 is
    the page header's counters and ring (the default group); lanes 1.. sit after the steps."""

    __slots__ = ("index", "context", "counters", "slots", "extra", "queued", "finished", "ahead",
                 "unrecorded", "p2p_waiting")

    def __init__(self, index, context):
        self.index = index
        self.context = context
        if index == 0:
            self.counters, self.slots, self.extra = QUEUED, HEADER_WORDS, LANE0_EXTRA
        else:
            base = LANES_BASE + (index - 1) * LANE_WORDS
            self.counters, self.slots, self.extra = base + L_QUEUED, base + 16, base + L_EXTRA
        self.queued = 0  # the last collective numbered
        self.finished = 0  # every collective up to this one finished
        self.ahead = set()  # finished, but some earlier collective has not
        self.unrecorded = 0  # collectives issued while this thread was recording (a signal)
        self.p2p_waiting = 0  # threads blocked in a send or recv's wait


class _Busy(_thread._local):
    depth = 0  # 1 while this thread records (or is about to): a signal handler then skips


class Recorder:
    """Owns the page: every write to it. Thread-safe, cheap, and never blocks a thread that is
    already recording: a Python signal handler that runs while its thread holds the lock and
    issues a collective finds the lock its own, and that collective is left unrecorded (counted
    in its lane's `unrecorded` word), instead of waiting forever. Its callers catch what it
    raises (an internal error) and call stop()."""

    def __init__(self, words):
        self._words = words
        self._lock = _thread.allocate_lock()
        self._busy = _Busy()
        self.writing = False  # claimed, in the claiming process, not stopped: read lock-free
        self._pid = 0  # the claiming process
        self._refused = False  # the page belongs to another process, or we stopped
        self._lanes = {}  # context -> _Lane
        self._steps = 0
        self.on_queued = None  # called after each collective recorded, outside the lock

    def _enter(self):
        """Takes the lock, unless this thread holds it (or is taking it): then False."""
        busy = self._busy
        if busy.depth:
            return False
        busy.depth = 1  # before acquiring: a signal from here on must not wait for the lock
        self._lock.acquire()
        return True

    def _leave(self):
        self._lock.release()
        self._busy.depth = 0

    # Claim and lifetime.

    def claim(self, rank, world_size, backend, timeout_ms, context):
        """Takes the page if no process has, and publishes it (once), with the default process
        group (`context`) in lane 0. Returns lane 0, or None when the page is not ours."""
        if not self._enter():
            return None
        try:
            w = self._words
            if self.writing or self._refused:
                return self._lanes.get(context) if self.writing else None
            if w[PID] != 0:  # libddp, the NCCL plugin or another process has it
                self._refused = True
                return None
            self._pid = os.getpid()
            w[PID] = self._pid
            w[VERSION] = RECORD_VERSION
            w[RANK] = rank
            w[WORLD_SIZE] = world_size
            w[BACKEND] = pack_name(backend)
            w[WRITER] = pack_name("torch")
            w[TIMEOUT_MS] = timeout_ms
            w[CONTEXT] = context
            w[LANE_STATE] = LANE_OPEN
            lane = self._lanes[context] = _Lane(0, context)
            w[MAGIC] = RECORD_MAGIC
            self.writing = True
            return lane
        finally:
            self._leave()

    def open_lane(self, context, rank, world_size, backend, timeout_ms):
        """The lane of another process group (`context`: the same on every rank): the one it had
        (a group made again under its name goes on with its numbering), else a free one; None
        when every lane is taken (that group is not recorded)."""
        if not self.writing or not self._mine() or not self._enter():
            return None
        try:
            lane = self._lanes.get(context)
            if lane is not None:
                return lane
            w = self._words
            taken = {lane.index for lane in self._lanes.values()}
            for index in range(1, EXTRA_LANES + 1):
                base = LANES_BASE + (index - 1) * LANE_WORDS
                if index in taken or w[base + L_STATE] != 0:  # libddp may hold one
                    continue
                w[base + L_STATE] = LANE_CLAIMING
                w[base + L_CONTEXT] = context
                w[base + L_BACKEND] = pack_name(backend)
                w[base + L_RANK] = rank
                w[base + L_WORLD_SIZE] = world_size
                w[base + L_TIMEOUT_MS] = timeout_ms
                w[base + L_STATE] = LANE_OPEN
                lane = self._lanes[context] = _Lane(index, context)
                return lane
            return None
        finally:
            self._leave()

    def raise_timeout(self, timeout_ms):
        """The job's collective timeout: the largest of its process groups'."""
        if not self.writing or not self._mine() or not self._enter():
            return
        try:
            if timeout_ms > self._words[TIMEOUT_MS]:
                self._words[TIMEOUT_MS] = timeout_ms
        finally:
            self._leave()

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
            self._words[MAGIC] = 0  # one store: no lock (this thread may hold it)
        _say("the Python probe stopped recording: %s: %s" % (type(error).__name__, error))

    def _mine(self):
        """Whether this process may write; the pid check catches forks that skipped
        os.register_at_fork (a fork from C that goes on running Python)."""
        if self._pid == os.getpid():
            return True
        self.forked()
        return False

    # Collectives: numbered per process group, each in its group's lane.

    def queue(self, lane, op, dtype, count, nbytes):
        """Records `lane`'s collective number queued+1 as issued now; returns its number, 0 when
        not recording. Its slot is reused only once the collective it held finished."""
        if not self.writing or not self._mine():
            return 0
        if not self._enter():
            self.skipped(lane)
            return 0
        try:
            now = time.monotonic_ns()
            seq = lane.queued = lane.queued + 1
            w = self._words
            base = lane.slots + (seq % COLLECTIVE_SLOTS) * COLLECTIVE_WORDS
            if w[base + C_SEQ] == 0 or w[base + C_FINISHED_NS] != 0:
                version = w[base + C_VERSION]
                w[base + C_VERSION] = version + 1
                # seq .. failed; Python cannot see a start: started_ns is queued_ns.
                _SLOT_FIELDS.pack_into(w, (base + C_SEQ) * 8, seq, op, dtype, count, nbytes,
                                       NO_BUCKET, now, now, 0, 0)
                w[base + C_VERSION] = version + 2
            _TWO_WORDS.pack_into(w, lane.counters * 8, seq, seq)  # queued, started
        finally:
            self._leave()
        if self.on_queued is not None:
            self.on_queued()
        return seq

    def skipped(self, lane):
        """A collective of `lane` issued while this thread records (by a signal handler) is not
        recorded: counted in the lane's unrecorded word (one store, no lock), so that the agent
        knows this rank's numbers lag behind its group's."""
        lane.unrecorded += 1
        self._words[lane.extra + X_UNRECORDED] = lane.unrecorded

    def finish(self, lane, seq, failed=False, communicator_failed=None):
        """`lane`'s collective `seq` completed (failed: with an error); again is a no-op.
        `finished` moves only over an unbroken run of finished numbers. communicator_failed (by
        default `failed`) sets the lane's failed word too. Returns False when this thread is
        already recording (a signal handler): the caller tries again later. (No pid check: a
        forked child has none of the threads that finish collectives, and queue() gave it no
        number.)"""
        if not seq or not self.writing:
            return True
        if not self._enter():
            return False
        try:
            if seq <= lane.finished or seq in lane.ahead:
                return True
            if communicator_failed is None:
                communicator_failed = failed
            now = time.monotonic_ns()
            w = self._words
            base = lane.slots + (seq % COLLECTIVE_SLOTS) * COLLECTIVE_WORDS
            if w[base + C_SEQ] == seq:
                version = w[base + C_VERSION]
                w[base + C_VERSION] = version + 1
                _TWO_WORDS.pack_into(w, (base + C_FINISHED_NS) * 8, now, 1 if failed else 0)
                w[base + C_VERSION] = version + 2
            if communicator_failed:
                w[lane.counters + (FAILED - QUEUED)] = 1
            if seq != lane.finished + 1:
                lane.ahead.add(seq)
                return True
            ahead = lane.ahead
            while seq + 1 in ahead:
                seq += 1
                ahead.remove(seq)
            lane.finished = seq
            # finished, last_finished_ns
            _TWO_WORDS.pack_into(w, (lane.counters + (FINISHED - QUEUED)) * 8, seq, now)
            return True
        finally:
            self._leave()

    def unfinished(self):
        """The collectives issued here that have not finished, as (lane index, number) pairs;
        empty when not recording (or when this thread is recording: a signal handler)."""
        if not self.writing or not self._enter():
            return frozenset()
        try:
            return frozenset((lane.index, seq) for lane in self._lanes.values()
                             for seq in range(lane.finished + 1, lane.queued + 1)
                             if seq not in lane.ahead)
        finally:
            self._leave()

    # Point-to-point: not numbered (a send meets a recv on one other rank, and ranks send and
    # receive unevenly), but a thread blocked in one's wait is: the lane's p2p words.

    def p2p_wait(self, lane, op, nbytes, peer):
        """This thread now waits for a send or recv of `lane` to `peer` (the group's rank;
        NO_PEER: any). Returns whether it was written (p2p_done must follow then)."""
        if not self.writing or not self._mine() or not self._enter():
            return False
        try:
            lane.p2p_waiting += 1
            if lane.p2p_waiting == 1:  # the oldest wait is the one shown
                _P2P_FIELDS.pack_into(self._words, (lane.extra + X_P2P_SINCE_NS) * 8,
                                      time.monotonic_ns(), op, nbytes, peer)
            return True
        finally:
            self._leave()

    def p2p_done(self, lane):
        """The wait p2p_wait recorded returned (or raised)."""
        if not self._enter():
            return  # a signal handler's wait inside ours: ours clears it
        try:
            lane.p2p_waiting -= 1
            if lane.p2p_waiting <= 0:
                lane.p2p_waiting = 0
                self._words[lane.extra + X_P2P_SINCE_NS] = 0
        finally:
            self._leave()

    def future_done(self, lane, seq, future):
        """A done callback for `lane`'s collective `seq`'s future (on any thread)."""
        try:
            failed = False
            try:
                future.value()
            except Exception:
                failed = True
            self.finish(lane, seq, failed)
        except Exception as error:
            self.stop(error)

    # DDP steps.

    def begin_step(self, begin_ns):
        """Step steps+1 begins at begin_ns; returns its number, 0 when not recording."""
        if not self.writing or not self._mine() or not self._enter():
            return 0
        try:
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
        finally:
            self._leave()

    def step_time(self, step, field, start_ns, now, total):
        """Step `step` reached `field` (S_READY_NS or S_FINALIZED_NS) at `now`; adds
        now - start_ns to header word `total`."""
        if not self.writing or not self._mine() or not self._enter():
            return
        try:
            w = self._words
            base = STEP_BASE + (step % STEP_SLOTS) * STEP_WORDS
            if w[base + S_STEP] == step:
                w[base + S_VERSION] += 1
                w[base + field] = now
                w[base + S_VERSION] += 1
            w[total] += now - start_ns
        finally:
            self._leave()


# Header word 31 (the reserved area's last): the descriptor faulthandler writes stacks into.
STACK_FD = 31
