"""Checks ddprun's Python probe (worker/python: sitecustomize.py, _ddprun_probe.py, _ddprun_record.py) without
ddprun: this script plays the agent, making each worker's record page and stack memfd, and reads
them back once the workers exited. Run it with each PyTorch:
    /usr/bin/python3 tests/launcher/agent/python/probe_check.py
    scripts/python-pytorch214 tests/launcher/agent/python/probe_check.py
Prints one line per check; exits 1 if any failed. `probe_check.py --worker MODE ...` is the
worker side, started by the checks."""

import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import traceback

CHECKOUT = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
# The probe as built (build/share/ddprun/python: with its native wrapper), which the test that
# runs this script names; else the source folder, where the probe falls back to a Python one.
PROBE_FOLDER = os.path.realpath(os.environ.get("DDP_PROBE_FOLDER")
                                or os.path.join(CHECKOUT, "worker", "python"))
NATIVE_WRAPPER = os.path.isfile(os.path.join(PROBE_FOLDER, "_ddprun_around.abi3.so"))
HEADER = os.path.join(CHECKOUT, "common", "include", "ddp", "common", "collective_record.hpp")
STACK_SIGNAL = signal.SIGRTMIN + 5
TIMEOUT_S = 120  # per worker: a hang fails the check instead of the run
PROBE_VARIABLES = ("DDPRUN_PYTHON_PROBE", "DDPRUN_RECORD_FD", "DDPRUN_STACK_FD",
                   "DDPRUN_STACK_SIGNAL")

OPS = {1: "all_reduce", 2: "broadcast", 3: "all_gather", 4: "reduce_scatter", 5: "barrier",
       6: "reduce", 7: "gather", 8: "scatter", 9: "all_to_all", 10: "send", 11: "recv",
       12: "other", 13: "gradients"}


# --- The page, as the agent reads it -------------------------------------------------------------


def layout_from_header():
    """Word counts of the page's structs, read from collective_record.hpp (its sizeof)."""
    text = open(HEADER).read()
    constants = {name: int(value) for name, value in
                 re.findall(r"constexpr std::uint32_t (\w+) = (\d+);", text)}

    def words(struct_name):
        body = re.search(r"struct %s \{(.*?)\n\};" % struct_name, text, re.S).group(1)
        total = 0
        for line in body.splitlines():
            line = line.split("//")[0].strip()
            atomic = re.match(r"std::atomic<std::uint64_t> \w+(?:\[(\d+)\])?;", line)
            nested = re.match(r"(\w+) \w+(?:\[(\w+)\])?;", line)
            if atomic:
                total += int(atomic.group(1) or 1)
            elif nested:
                total += words(nested.group(1)) * (constants[nested.group(2)]
                                                   if nested.group(2) else 1)
        return total

    return {"page_words": words("RecordPage"), "collective_words": words("CollectiveSlot"),
            "step_words": words("StepSlot"), "collective_slots": constants["kCollectiveSlots"],
            "step_slots": constants["kStepSlots"], "lane_words": words("CommunicatorLane"),
            "extra_lanes": constants["kExtraLanes"]}


LAYOUT = layout_from_header()
PAGE_BYTES = LAYOUT["page_words"] * 8
COLLECTIVES_WORDS = LAYOUT["collective_slots"] * LAYOUT["collective_words"]
STEPS_WORDS = LAYOUT["step_slots"] * LAYOUT["step_words"]
LANES_WORDS = LAYOUT["extra_lanes"] * LAYOUT["lane_words"]
HEADER_WORDS = LAYOUT["page_words"] - COLLECTIVES_WORDS - STEPS_WORDS - LANES_WORDS
HEADER_NAMES = ["magic", "version", "pid", "rank", "world_size", "backend", "queued", "started",
                "finished", "last_finished_ns", "failed", "steps", "compute_ns_total",
                "wait_ns_total", "stop_requested", "writer", "stack_signal", "timeout_ms",
                "lane_state", "context", "step_context"] + ["reserved"] * 5 + [
                "unrecorded", "p2p_since_ns", "p2p_op", "p2p_bytes", "p2p_peer", "stack_fd"]
LANE_NAMES = ["state", "context", "backend", "rank", "world_size", "timeout_ms", "queued",
              "started", "finished", "last_finished_ns", "failed", "unrecorded", "p2p_since_ns",
              "p2p_op", "p2p_bytes", "p2p_peer"]
LANES_BASE = HEADER_WORDS + COLLECTIVES_WORDS + STEPS_WORDS
COLLECTIVE_NAMES = ["version", "seq", "op", "dtype", "count", "bytes", "bucket", "queued_ns",
                    "started_ns", "finished_ns", "failed"]
STEP_NAMES = ["version", "step", "begin_ns", "ready_ns", "finalized_ns"]


def unpack_name(word):
    return word.to_bytes(8, "little").split(b"\0")[0].decode()


class Page:
    """One worker's record page: a zeroed memfd of sizeof(RecordPage) bytes."""

    def __init__(self, size=PAGE_BYTES):
        self.fd = os.memfd_create("ddprun-record")
        os.ftruncate(self.fd, size)

    def words(self):
        return struct.unpack("<%dQ" % LAYOUT["page_words"], os.pread(self.fd, PAGE_BYTES, 0))

    def header(self):
        return dict(zip(HEADER_NAMES, self.words()))

    def collectives(self, lane=0):
        """The used collective slots of lane `lane`, by seq."""
        base = HEADER_WORDS if lane == 0 else LANES_BASE + (lane - 1) * LAYOUT["lane_words"] + 16
        return self._slots(base, "collective", COLLECTIVE_NAMES, "seq")

    def lanes(self):
        """Lanes 1.. that a process group took: {context: (lane index, header)}."""
        w, found = self.words(), {}
        for index in range(1, LAYOUT["extra_lanes"] + 1):
            base = LANES_BASE + (index - 1) * LAYOUT["lane_words"]
            header = dict(zip(LANE_NAMES, w[base:base + 16]))
            if header["state"]:
                found[header["context"]] = (index, header)
        return found

    def steps(self):
        """The used step slots, by step."""
        return self._slots(HEADER_WORDS + COLLECTIVES_WORDS, "step", STEP_NAMES, "step")

    def _slots(self, base, kind, names, key):
        w, size = self.words(), LAYOUT[kind + "_words"]
        slots = [dict(zip(names, w[base + i * size:][:size]))
                 for i in range(LAYOUT[kind + "_slots"])]
        return sorted((s for s in slots if s[key]), key=lambda s: s[key])


def stack_memfd():
    return os.memfd_create("ddprun-python-stacks")  # the probe takes no other file


def read_all(fd):
    return os.pread(fd, os.fstat(fd).st_size, 0).decode(errors="replace")


# --- Running workers ------------------------------------------------------------------------------


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_env(page, stacks, python_path=PROBE_FOLDER, **extra):
    """Our environment with the probe's variables as ddprun would set them."""
    env = {k: v for k, v in os.environ.items() if k not in PROBE_VARIABLES}
    env.update(PYTHONPATH=python_path, PYTHONUNBUFFERED="1", **extra)
    if page is not None:
        env["DDPRUN_RECORD_FD"] = str(page.fd)
    if stacks is not None:
        env.update(DDPRUN_STACK_FD=str(stacks), DDPRUN_STACK_SIGNAL=str(int(STACK_SIGNAL)))
    return env


def start(args, page, stacks, python_flags=(), stdin=None, **env):
    """A python with `args`, inheriting the page's and the stacks' descriptors."""
    fds = [fd for fd in (page.fd if page else None, stacks) if fd is not None]
    return subprocess.Popen([sys.executable, *python_flags, *args],
                            env=worker_env(page, stacks, **env), pass_fds=fds, stdin=stdin,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(process):
    try:
        out, err = process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        err += "\n(killed after %d s)" % TIMEOUT_S
    return process.returncode, out, err


def worker(mode, *args, page=None, stacks=None, **env):
    return finish(start([__file__, "--worker", mode, *args], page, stacks, **env))


def report_of(out):
    """The worker's `report {json}` line, or {}."""
    for line in out.splitlines():
        if line.startswith("report "):
            return json.loads(line[len("report "):])
    return {}


def probe_lines(err):
    return [line for line in err.splitlines() if line.startswith("ddprun:")]


# --- The checks -----------------------------------------------------------------------------------


class Checks:
    def __init__(self):
        self.failed = 0

    def expect(self, condition, what, detail=""):
        if condition:
            print("ok   %s" % what)
        else:
            print("FAIL %s: %s" % (what, detail))
        self.failed += not condition
        return condition


def hooks_version():
    """Whether this PyTorch has the process groups' pre/post hooks (2.x) or not (1.13)."""
    code = "import torch.distributed as d; print(hasattr(d.ProcessGroup, 'register_pre_hook'))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=worker_env(None, None, python_path=""))
    return result.stdout.strip() == "True"


def expected_ops(hooks):
    """The collectives the job worker issues, in order, as this PyTorch shows them."""
    # The all_reduce on the new group is in that group's lane.
    user = ["all_reduce", "all_reduce", "broadcast", "barrier", "all_reduce",
            "all_gather", "all_gather"]  # ... the last two: all_gather_object
    if not hooks:  # DDP's own collectives are C++ calls: one gradient reduction per step, and
        # its construction's broadcast of the module's state (torch.distributed's
        # _broadcast_coalesced, which a BatchNorm model's forward calls too)
        return user + ["broadcast"] + ["gradients"] * 3
    # DDP's construction: verify the parameters' shapes, broadcast the module's state; step 1:
    # one bucket; step 2 (buckets rebuilt): broadcast of the new bucket order and sizes.
    ddp = ["all_gather", "broadcast", "broadcast", "all_reduce",
           "broadcast", "broadcast", "all_reduce", "all_reduce"]
    return user + ddp


def check_job(checks, hooks):
    """Two ranks: collectives, a new group, DDP for 3 steps plus a no_grad forward."""
    port = str(free_port())
    pages = [Page(), Page()]
    processes = [start([__file__, "--worker", "job", str(rank), port], pages[rank], stack_memfd())
                 for rank in range(2)]
    results = [finish(p) for p in processes]
    for rank, ((rc, out, err), page, process) in enumerate(zip(results, pages, processes)):
        name = "job rank %d" % rank
        if checks.expect(rc == 0, name + " exits 0", "rc %s\n%s%s" % (rc, out, err)):
            check_job_rank(checks, hooks, name, rank, process.pid, page, out, err)


def check_job_rank(checks, hooks, name, rank, pid, page, out, err):
    checks.expect(not probe_lines(err), name + " says nothing", err)
    report = report_of(out)
    checks.expect(report["launcher_on_path"] == [], name + ": sys.path holds no worker/python",
                  report["launcher_on_path"])
    checks.expect(report["pythonpath"] is None, name + ": PYTHONPATH is unset",
                  report["pythonpath"])

    h = page.header()
    checks.expect(h["magic"] == 0x3130434552504444 and h["version"] == 2,
                  name + ": published", h)
    checks.expect(h["pid"] == pid, name + ": pid", (h["pid"], pid))
    checks.expect((h["rank"], h["world_size"]) == (rank, 2), name + ": rank and world size",
                  (h["rank"], h["world_size"]))
    checks.expect(unpack_name(h["backend"]) == "gloo" and unpack_name(h["writer"]) == "torch",
                  name + ": backend gloo, writer torch", (h["backend"], h["writer"]))
    checks.expect(h["stack_signal"] == STACK_SIGNAL, name + ": stack_signal", h["stack_signal"])
    checks.expect(h["timeout_ms"] == 90000, name + ": timeout_ms (the new group's 90 s)",
                  h["timeout_ms"])

    ops = expected_ops(hooks)
    checks.expect(h["queued"] == h["started"] == h["finished"] == len(ops),
                  name + ": queued == started == finished == %d" % len(ops),
                  {k: h[k] for k in ("queued", "started", "finished")})
    checks.expect(h["failed"] == 0 and h["last_finished_ns"] > 0, name + ": none failed", h)
    slots = page.collectives()
    seen = [OPS.get(s["op"], s["op"]) for s in slots]
    checks.expect(seen == ops, name + ": the ops in the slots",
                  "%s\n      expected %s" % (seen, ops))
    checks.expect(all(0 < s["queued_ns"] == s["started_ns"] <= s["finished_ns"]
                      and not s["failed"] and s["version"] == 4 and s["bucket"] == 2**64 - 1
                      for s in slots),
                  name + ": slots written twice (queued, finished), times in order", slots[:2])
    first, barrier = slots[0], slots[3]
    checks.expect((unpack_name(first["dtype"]), first["count"], first["bytes"])
                  == ("float32", 3, 12), name + ": first slot: float32, 3 elements, 12 bytes",
                  first)
    checks.expect((barrier["dtype"], barrier["count"]) == (0, 0),
                  name + ": barrier has no tensor", barrier)
    if not hooks:
        gradients = slots[-1]
        parameters = 4 * 8 + 8 + 8 * 1 + 1
        checks.expect((unpack_name(gradients["dtype"]), gradients["count"])
                      == ("float32", parameters), name + ": gradient reduction: every parameter",
                      gradients)

    lanes = page.lanes()
    index, lane = lanes.get(3, (0, {}))  # the group's name is "2": new_group([0]) was "1"
    checks.expect(sorted(lanes) == ([2, 3] if rank == 0 else [3]) and lane["rank"] == rank and lane["world_size"] == 2
                  and lane["timeout_ms"] == 90000 and unpack_name(lane["backend"]) == "gloo"
                  and lane["queued"] == lane["finished"] == 1,
                  name + ": the new group in a lane of its own (context 3)", lanes)
    group_ops = [OPS.get(s["op"]) for s in page.collectives(index)] if index else []
    checks.expect(group_ops == ["all_reduce"], name + ": its all_reduce there", group_ops)

    steps = page.steps()
    checks.expect(h["steps"] == 3 and [s["step"] for s in steps] == [1, 2, 3],
                  name + ": 3 steps (the no_grad forward is none)", (h["steps"], steps))
    checks.expect(all(0 < s["begin_ns"] <= s["ready_ns"] <= s["finalized_ns"] for s in steps),
                  name + ": step times in order", steps)
    compute = sum(s["ready_ns"] - s["begin_ns"] for s in steps)
    wait = sum(s["finalized_ns"] - s["ready_ns"] for s in steps)
    checks.expect((h["compute_ns_total"], h["wait_ns_total"]) == (compute, wait),
                  name + ": compute and wait totals", h)


def check_world_of_one(checks, hooks):
    """A 1-rank world: the probe off leaves the page zero; on, a collective refused at issue is
    closed as failed, and a forked child writes nothing."""
    page = Page()
    rc, out, err = worker("world1", str(free_port()), page=page, stacks=stack_memfd(),
                          DDPRUN_PYTHON_PROBE="0")
    checks.expect(rc == 0 and not probe_lines(err), "DDPRUN_PYTHON_PROBE=0: runs", err)
    checks.expect(not any(page.words()), "DDPRUN_PYTHON_PROBE=0: the page stays zero")

    page = Page()
    rc, out, err = worker("world1", str(free_port()), page=page, stacks=stack_memfd())
    checks.expect(rc == 0 and not probe_lines(err), "world of one: runs", (rc, err))
    h = page.header()
    checks.expect(h["magic"] != 0 and h["world_size"] == 1 and h["queued"] == h["finished"] >= 1,
                  "world of one: published, every collective finished", h)
    slots = page.collectives()
    refused = slots[1] if len(slots) > 1 else {}
    # 2.14: the backend refused it before its post hook; the next collective closes it. 1.13: the
    # function raised, which the probe cannot tell from a broken communicator.
    checks.expect(OPS.get(refused.get("op")) == "broadcast" and refused.get("failed") == 1
                  and refused.get("finished_ns", 0) > 0 and h["failed"] == (0 if hooks else 1),
                  "a broadcast from an invalid root: closed, failed", (h, slots[:3]))
    checks.expect(h["steps"] == 0 and not page.steps(),
                  "forked child: its DDP forward is not recorded", h["steps"])
    check_no_frames_of_ours(checks, "world of one: an invalid root, a DDP forward that raises",
                            report_of(out).get("tracebacks"), 2)


def check_no_frames_of_ours(checks, what, tracebacks, count):
    """Tracebacks through the calls the probe wraps show the program's frames and PyTorch's,
    none of ours (with the native wrapper; without it, the Python one's are expected)."""
    tracebacks = tracebacks or []
    ours = [t for t in tracebacks if "_ddprun" in t]
    if not NATIVE_WRAPPER:
        print("skip %s: no frame of ours (no native wrapper in %s)" % (what, PROBE_FOLDER))
        return
    checks.expect(len(tracebacks) == count and not ours,
                  "%s: no frame of ours in the tracebacks" % what, tracebacks)


def check_failures(checks):
    """A collective whose peer died is recorded as failed; an internal error of the probe stops
    it in one line, unpublishes the page, and leaves the program alone."""
    port = str(free_port())
    pages = [Page(), Page()]
    processes = [start([__file__, "--worker", "peer_dies", str(rank), port], pages[rank],
                       stack_memfd()) for rank in range(2)]
    (rc, out, err), _ = [finish(p) for p in processes]
    h = pages[0].header()
    slots = pages[0].collectives()
    checks.expect(rc == 0 and "raised" in out, "peer died: the all_reduce raised", (rc, out, err))
    check_no_frames_of_ours(checks, "peer died: a collective and an async one's wait",
                            report_of(out).get("tracebacks"), 2)
    checks.expect(h["failed"] == 1 and h["queued"] == h["finished"] == 3
                  and all(slot["failed"] == 1 and OPS[slot["op"]] == "all_reduce"
                          for slot in slots[1:]),
                  "peer died: recorded as failed (a collective, then an async one)", (h, slots))

    page = Page()
    rc, out, err = worker("probe_breaks", str(free_port()), page=page, stacks=stack_memfd())
    lines = probe_lines(err)
    checks.expect(rc == 0 and report_of(out).get("sums") == [1.0, 1.0, 1.0],
                  "internal error: the program's results unchanged", (rc, out, err))
    checks.expect(len(lines) == 1 and "injected" in lines[0]
                  and lines[0].startswith("ddprun: the Python probe stopped recording: "),
                  "internal error: one line", err)
    checks.expect(page.header()["magic"] == 0, "internal error: the page is unpublished",
                  page.header())


def check_subgroups(checks, hooks):
    """Ranks that use groups unevenly: each group numbered on its own, in its own lane, matched
    across ranks by context; sends and receives and uneven all_to_all splits are no numbered
    collectives of the default group (their order differs between ranks)."""
    port = str(free_port())
    pages = [Page(), Page()]
    processes = [start([__file__, "--worker", "subgroups", str(rank), port], pages[rank],
                       stack_memfd()) for rank in range(2)]
    results = [finish(p) for p in processes]
    if not checks.expect(all(rc == 0 for rc, _, _ in results), "subgroups: both exit 0",
                         results):
        return
    lanes = [page.lanes() for page in pages]
    checks.expect(sorted(lanes[0]) == [2, 3] and sorted(lanes[1]) == [3],
                  "subgroups: rank 0 has groups 1 and 2 (contexts 2, 3), rank 1 only group 2",
                  lanes)
    solo = lanes[0].get(2, (0, {}))
    checks.expect(solo[1].get("world_size") == 1 and solo[1].get("queued") == 2
                  and solo[1].get("finished") == 2, "subgroups: rank 0's own group: 2 calls",
                  solo)
    pair = [lane.get(3, (0, {})) for lane in lanes]
    checks.expect(all(p[1].get("queued") == p[1].get("finished") == 1 for p in pair)
                  and pair[0][0] == 2 and pair[1][0] == 1,
                  "subgroups: the shared group numbered alike in different lanes", pair)
    default_ops = ["all_to_all", "barrier"] + (["all_gather", "reduce_scatter"] if hooks else [])
    for rank, page in enumerate(pages):
        h = page.header()
        ops = [OPS.get(slot["op"]) for slot in page.collectives()]
        checks.expect(ops == default_ops and h["queued"] == h["finished"] == len(ops)
                      and h["p2p_since_ns"] == 0,
                      "subgroups rank %d: the default group's collectives, no send or recv"
                      % rank, (ops, h))
        slots = page.collectives()
        counts = [slot["count"] for slot in slots]
        expected = [2 if rank == 0 else 6, 0] + ([4, 2] if hooks else [])
        checks.expect(counts == expected,
                      "subgroups rank %d: counts (uneven all_to_all, all_gather_into_tensor's "
                      "input, reduce_scatter_tensor's output)" % rank, (counts, expected))


def check_p2p_wait(checks):
    """A thread blocked in a recv's wait (a Work without a future) shows in the page until the
    send comes; then the page says no wait."""
    port = str(free_port())
    pages = [Page(), Page()]
    sender = start([__file__, "--worker", "p2p", "0", port], pages[0], stack_memfd(),
                   stdin=subprocess.PIPE)
    receiver = start([__file__, "--worker", "p2p", "1", port], pages[1], stack_memfd())
    waiting = receiver.stdout.readline().strip()
    deadline = time.monotonic() + 90
    h = pages[1].header()
    while h["p2p_since_ns"] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)  # polls the page the worker writes: nothing to wait on otherwise
        h = pages[1].header()
    checks.expect(waiting == "waiting" and h["p2p_since_ns"] > 0
                  and (OPS.get(h["p2p_op"]), h["p2p_bytes"], h["p2p_peer"]) == ("recv", 16, 0),
                  "p2p: the receiver waits in recv from rank 0, 16 bytes", (waiting, h))
    sender.stdin.write("go\n")
    sender.stdin.flush()
    results = [finish(sender), finish(receiver)]
    checks.expect(all(rc == 0 for rc, _, _ in results), "p2p: both exit 0", results)
    for rank, page in enumerate(pages):
        h = page.header()
        checks.expect(h["p2p_since_ns"] == 0 and h["queued"] == h["finished"] == 1,
                      "p2p rank %d: no wait left, only the barrier numbered" % rank, h)


def check_signal_reentry(checks):
    """A collective in a signal handler that runs while the probe records: it is left
    unrecorded (counted), and nothing waits; a repeating timer whose handler issues
    collectives while the program does too runs to its end."""
    page = Page()
    process = start([__file__, "--worker", "reentry", str(free_port())], page, stack_memfd())
    try:
        out, err = process.communicate(timeout=60)
        rc = process.returncode
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        rc, err = None, err + "\n(killed after 60 s: a deadlock)"
    report = report_of(out)
    h = page.header()
    checks.expect(rc == 0 and report.get("handler_calls") == 1 and report.get("ticks", 0) > 0,
                  "signal handler: its collective inside the probe's write completes", (rc, err))
    checks.expect(h["unrecorded"] >= 1 and h["queued"] == h["finished"],
                  "signal handler: its collective counted as unrecorded", h)


def check_async(checks):
    """Asynchronous collectives finish when the program sees them complete: through wait(),
    through the Work's future, through is_completed(); one it never waits for, at its next
    collective."""
    page = Page()
    rc, out, err = worker("async", str(free_port()), page=page, stacks=stack_memfd())
    report = report_of(out)
    checks.expect(rc == 0 and report.get("finished") == [1, 2, 3, 3, 5],
                  "async: finished through wait, future, is_completed; a dropped one at the "
                  "next collective", (rc, report, err))
    h = page.header()
    checks.expect(h["queued"] == h["finished"] >= 5 and h["failed"] == 0,
                  "async: every one finished", h)


def check_nccl_left_to_plugin(checks):
    """A job whose default group is NCCL is not the probe's (a NCCL Work's future completes at
    enqueue: the NCCL profiler plugin records it, claiming the page itself); a Gloo job's NCCL
    subgroup takes no lane. Driven through the probe's group watch with stand-ins for c10d
    (no NCCL here)."""
    import types

    sys.path.insert(0, PROBE_FOLDER)
    try:
        import _ddprun_probe
        import _ddprun_record
    finally:
        sys.path.remove(PROBE_FOLDER)

    class Group:
        def __init__(self, name, rank=0, size=2):
            self.group_name, self._rank, self._size = name, rank, size

        def rank(self):
            return self._rank

        def size(self):
            return self._size

    def run(backends):
        """Makes one group per backend (the first the default); returns the page's words."""
        page = Page()
        probe = _ddprun_probe._Probe(_ddprun_record.Recorder(_ddprun_record._map_page(page.fd)))
        made = []

        def helper(group_size, group_rank, global_ranks_in_group, backend, store,
                   group_name=None, backend_options=None, timeout=None):
            made.append(Group(group_name))
            return made[-1]

        c10d = types.SimpleNamespace(
            _new_process_group_helper=helper, is_initialized=lambda: bool(made[1:]),
            _get_default_group=lambda: made[0])
        dist = types.SimpleNamespace(ProcessGroup=Group)
        _ddprun_probe._watch_groups(probe, dist, c10d)
        for number, backend in enumerate(backends):
            c10d._new_process_group_helper(2, 0, [0, 1], backend, None, group_name=str(number))
        return page.header(), page.lanes()

    h, lanes = run(["nccl", "gloo"])
    checks.expect(h["pid"] == 0 and h["magic"] == 0 and not lanes,
                  "a NCCL default group: the page is left to the NCCL plugin", (h, lanes))
    h, lanes = run(["cpu:gloo,cuda:nccl"])
    checks.expect(h["pid"] == 0, "cpu:gloo,cuda:nccl: the page is left to the NCCL plugin", h)
    h, lanes = run(["gloo", "nccl", "gloo"])
    checks.expect(h["pid"] == os.getpid() and sorted(lanes) == [3],
                  "a Gloo job: its NCCL subgroup takes no lane, its Gloo one does", (h, lanes))


def check_stack_signal(checks):
    """A worker that never imports torch: the signal dumps its stacks and it goes on; the page
    holds nothing but stack_signal."""
    page, stacks = Page(), stack_memfd()
    process = start([__file__, "--worker", "sleep"], page, stacks)
    ready = process.stdout.readline()
    if not checks.expect(ready.strip() == "ready", "sleeping worker starts", ready):
        return
    os.kill(process.pid, STACK_SIGNAL)
    rc, out, err = finish(process)
    dump = read_all(stacks)
    checks.expect(rc == 0 and "alive" in out, "stack signal: the worker goes on", (rc, out, err))
    checks.expect(re.search(r"^Current thread 0x[0-9a-f]+", dump, re.M)
                  and re.search(r"^Thread 0x[0-9a-f]+", dump, re.M)
                  and "in worker_sleep" in dump and "in sleeping_thread" in dump,
                  "stack signal: every thread's stack in DDPRUN_STACK_FD", dump)
    checks.expect(report_of(out).get("torch_imported") is False,
                  "no torch: the probe imports none")
    words = list(page.words())
    checks.expect(words[16] == STACK_SIGNAL and not any(words[:16] + words[17:31] + words[32:]),
                  "no torch: the page holds only stack_signal and stack_fd", page.header())
    # The probe's own copy of the stack file: high (programs close and reuse low numbers), the
    # inherited one closed (the worker reports its descriptors).
    checks.expect(words[31] >= 900 and words[31] != stacks
                  and report_of(out).get("stack_fds") == [words[31]],
                  "stack file: on a high descriptor of the probe's, the inherited one closed",
                  (words[31], stacks, report_of(out).get("stack_fds")))


def check_user_sitecustomize(checks):
    """A user's sitecustomize on PYTHONPATH after ours runs, and is the module left; an error
    in it is reported as site.py reports it."""
    with tempfile.TemporaryDirectory() as folder:
        user_file = os.path.join(folder, "sitecustomize.py")
        with open(user_file, "w") as f:
            f.write("print('user sitecustomize ran')\n")
        rc, out, err = worker("plain", page=Page(), stacks=stack_memfd(),
                              python_path=PROBE_FOLDER + os.pathsep + folder)
        report = report_of(out)
        checks.expect(rc == 0 and "user sitecustomize ran" in out, "user sitecustomize runs",
                      (out, err))
        checks.expect(report.get("sitecustomize") == user_file,
                      "sys.modules['sitecustomize'] is the user's", report)
        checks.expect(report.get("pythonpath") == folder and report.get("launcher_on_path") == [],
                      "PYTHONPATH and sys.path without worker/python", report)

        with open(user_file, "w") as f:
            f.write("raise ValueError('user bug')\n")
        rc, out, err = worker("plain", page=Page(), stacks=stack_memfd(),
                              python_path=PROBE_FOLDER + os.pathsep + folder)
        checks.expect(rc == 0 and report_of(out) and "Error in sitecustomize; set PYTHONVERBOSE "
                      "for traceback:\nValueError: user bug\n" in err,
                      "a failing user sitecustomize is reported as site.py does", err)


def check_start_up(checks):
    """sitecustomize without a user's one, python -I, broken or missing pages."""
    # Every interpreter here has Debian's sitecustomize: the probe chains to it.
    rc, out, err = worker("plain", page=Page(), stacks=stack_memfd(),
                          python_path=PROBE_FOLDER + os.pathsep)
    code = ("import sys; m = sys.modules.get('sitecustomize'); "
            "print(m.__file__ if m else None)")
    plain = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env=worker_env(None, None, python_path=""))
    checks.expect(str(report_of(out).get("sitecustomize")) == plain.stdout.strip(),
                  "without a user's: sitecustomize as under a plain python", (out, plain.stdout))

    # No sitecustomize at all: site.py's own execsitecustomize, with a sys.path holding only
    # worker/python (and the modules the probe needs imported before).
    code = ("import atexit, faulthandler, functools, importlib.util, mmap, site, struct, sys\n"
            "import threading, weakref\n"
            "sys.path[:] = [%r]\n"
            "site.execsitecustomize()\n"
            "print('sitecustomize' in sys.modules, sys.path)" % PROBE_FOLDER)
    rc, out, err = finish(start(["-c", code], Page(), stack_memfd(), python_flags=["-S"]))
    checks.expect(rc == 0 and out.strip() == "False []" and not err,
                  "without any sitecustomize: none in sys.modules, silent", (out, err))

    page = Page()
    process = start(["-c", "print('isolated')"], page, stack_memfd(), python_flags=["-I"])
    rc, out, err = finish(process)
    checks.expect(rc == 0 and out.strip() == "isolated" and not err and not any(page.words()),
                  "python -I just runs", (rc, out, err))

    rc, out, err = worker("plain", page=Page(size=4096), stacks=stack_memfd())
    lines = probe_lines(err)
    checks.expect(rc == 0 and report_of(out) and len(lines) == 1
                  and lines[0].startswith("ddprun: the Python probe is off in this worker: "),
                  "a page of the wrong size: one line, and the program runs", err)

    rc, out, err = worker("plain", page=None, stacks=None, DDPRUN_RECORD_FD="97")
    checks.expect(rc == 0 and not err, "DDPRUN_RECORD_FD not inherited: silent", err)


def main():
    checks = Checks()
    hooks = hooks_version()
    print("PyTorch with process group hooks: %s; page of %d bytes" % (hooks, PAGE_BYTES))
    checks.expect(PAGE_BYTES == 256 + 256 * 128 + 64 * 64 + 3 * (128 + 256 * 128)
                  and HEADER_WORDS == 32, "page layout", LAYOUT)
    check_user_sitecustomize(checks)
    check_start_up(checks)
    check_stack_signal(checks)
    check_world_of_one(checks, hooks)
    check_failures(checks)
    check_signal_reentry(checks)
    check_subgroups(checks, hooks)
    check_p2p_wait(checks)
    check_async(checks)
    check_nccl_left_to_plugin(checks)
    check_job(checks, hooks)
    print("%d failed" % checks.failed if checks.failed else "all passed")
    return 1 if checks.failed else 0


# --- Worker side ----------------------------------------------------------------------------------


def stack_fds():
    """This process's descriptors on a stack file."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink("/proc/self/fd/" + name).startswith("/memfd:ddprun-python-stacks"):
                found.append(int(name))
        except OSError:
            pass
    return sorted(found)


def report(**fields):
    """One `report {json}` line: what the worker saw of its start-up, and `fields`."""
    fields.update(
        stack_fds=stack_fds(),
        launcher_on_path=[p for p in sys.path if os.path.realpath(p or ".") == PROBE_FOLDER],
        pythonpath=os.environ.get("PYTHONPATH"),
        sitecustomize=getattr(sys.modules.get("sitecustomize"), "__file__", None),
        torch_imported="torch" in sys.modules)
    sys.stdout.write("report %s\n" % json.dumps(fields))


def small_model(torch):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))


def init(dist, port, rank, world_size, timeout_s=60):
    from datetime import timedelta

    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%s" % port, rank=int(rank),
                            world_size=world_size, timeout=timedelta(seconds=timeout_s))


def worker_job(rank, port):
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    init(dist, port, rank, 2)
    t = torch.ones(3)
    dist.all_reduce(t)
    dist.all_reduce(t)
    dist.broadcast(t, 0)
    dist.barrier()
    dist.all_reduce(t, async_op=True).wait()
    dist.new_group([0], timeout=timedelta(seconds=90))  # rank 0 alone, unused: no lane on 1
    group = dist.new_group([0, 1], timeout=timedelta(seconds=90))
    dist.all_reduce(t, group=group)
    gathered = [None, None]
    dist.all_gather_object(gathered, rank)
    model = torch.nn.parallel.DistributedDataParallel(small_model(torch))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        model(torch.randn(2, 4)).sum().backward()
        optimizer.step()
    with torch.no_grad():
        model(torch.randn(2, 4))
    report(gathered=gathered)
    dist.destroy_process_group()


def worker_world1(port):
    import torch
    import torch.distributed as dist

    init(dist, port, 0, 1)
    dist.all_reduce(torch.ones(1))
    tracebacks = []
    try:
        dist.broadcast(torch.ones(1), src=5)  # no such rank: raises at issue
    except (RuntimeError, ValueError):
        tracebacks.append(traceback.format_exc())
    model = torch.nn.parallel.DistributedDataParallel(small_model(torch))  # 2.14: collectives
    try:
        with torch.no_grad():  # (a step that began would stay open)
            model(torch.randn(2, 5))  # the wrong width: the forward raises
    except RuntimeError:
        tracebacks.append(traceback.format_exc())
    dist.barrier()
    child = os.fork()
    if child == 0:  # a forward would begin a step: the forked child must not record it
        model(torch.randn(2, 4))
        os._exit(0)
    os.waitpid(child, 0)
    report(tracebacks=tracebacks)  # no destroy_process_group: the exit must not crash


def worker_peer_dies(rank, port):
    import torch
    import torch.distributed as dist

    init(dist, port, rank, 2, timeout_s=20)
    dist.barrier()
    if rank == "1":
        os._exit(0)
    time.sleep(0.5)  # rank 1 is gone
    try:
        dist.all_reduce(torch.ones(2))
        print("no error")
    except RuntimeError:
        print("raised")
        tracebacks = [traceback.format_exc()]
        try:
            dist.all_reduce(torch.ones(2), async_op=True).wait()
        except RuntimeError:
            tracebacks.append(traceback.format_exc())
        report(tracebacks=tracebacks)
    sys.stdout.flush()
    os._exit(0)  # the group is broken: skip its teardown


def worker_probe_breaks(port):
    import torch
    import torch.distributed as dist

    class Broken:
        def pack_into(self, *args):
            raise RuntimeError("injected")

    init(dist, port, 0, 1)
    sums = []
    for i in range(3):
        if i == 1:  # the probe's slot writer breaks: its next record fails
            sys.modules["_ddprun_record"]._SLOT_FIELDS = Broken()
        t = torch.ones(1)
        dist.all_reduce(t)
        sums.append(t.item())
    report(sums=sums)
    dist.destroy_process_group()


def worker_subgroups(rank, port):
    import torch
    import torch.distributed as dist

    init(dist, port, rank, 2)
    solo = dist.new_group([0])
    pair = dist.new_group([0, 1])
    t = torch.ones(4)
    if rank == "0":
        dist.all_reduce(t, group=solo)
        dist.all_reduce(t, group=solo, async_op=True).wait()
        dist.send(t, 1)
    else:
        dist.recv(t, 0)
    dist.all_reduce(t, group=pair)
    # Uneven splits: rank 0 sends 1 + 1, rank 1 sends 3 + 3; each receives 1 + 3.
    sent = torch.ones(2 if rank == "0" else 6)
    dist.all_to_all_single(torch.empty(4), sent, [1, 3], [1, 1] if rank == "0" else [3, 3])
    dist.barrier()
    if hasattr(dist.ProcessGroup, "register_pre_hook"):  # Gloo has these in 2.x only
        dist.all_gather_into_tensor(torch.empty(8), t)
        dist.reduce_scatter_tensor(torch.empty(2), t)  # a Work without a future
    report()
    dist.destroy_process_group()


def worker_p2p(rank, port):
    import torch
    import torch.distributed as dist

    init(dist, port, rank, 2)
    t = torch.ones(4)
    if rank == "0":
        sys.stdin.readline()  # the checker saw rank 1 wait
        dist.send(t, 1)
    else:
        work = dist.irecv(t, 0)
        print("waiting", flush=True)
        work.wait()
    dist.barrier()
    report()
    dist.destroy_process_group()


def worker_async(port):
    import torch
    import torch.distributed as dist

    def finished():  # the page's finished word, as the agent reads it
        return struct.unpack("<Q", os.pread(int(os.environ["DDPRUN_RECORD_FD"]), 8, 8 * 8))[0]

    init(dist, port, 0, 1)
    t = torch.ones(2)
    seen = []
    dist.all_reduce(t, async_op=True).wait()
    seen.append(finished())
    dist.all_reduce(t, async_op=True).get_future().wait()
    # The future's callbacks run on Gloo's thread, which may be just behind this one.
    deadline = time.monotonic() + 60
    while finished() < 2 and time.monotonic() < deadline:
        time.sleep(0.001)  # hands the GIL to that thread: nothing to wait on from here
    seen.append(finished())
    work = dist.all_reduce(t, async_op=True)
    while not work.is_completed():
        pass
    seen.append(finished())
    dropped = dist.all_reduce(t, async_op=True)
    del dropped
    seen.append(finished())  # not seen yet (it may well have completed)
    # The next collective finds it completed: Gloo may still be running it when the barrier
    # is issued, so barriers follow until it is seen (each checks the open Works).
    deadline, barriers = time.monotonic() + 60, 0
    while time.monotonic() < deadline:
        dist.barrier()
        barriers += 1
        if finished() == 4 + barriers:
            break
    seen.append(finished() - barriers + 1)
    report(finished=seen)
    dist.destroy_process_group()


def worker_reentry(port):
    import signal

    import torch
    import torch.distributed as dist

    init(dist, port, 0, 1)
    calls = []

    def handler(signum, frame):
        dist.barrier()  # a SIGTERM handler that saves a checkpoint behind a barrier, say
        calls.append(signum)

    signal.signal(signal.SIGUSR1, handler)
    probe = sys.modules["_ddprun_record"]  # the page writer

    class SignalInWrite:  # sends the signal once while the probe writes a record
        def __init__(self, real):
            self.real, self.armed = real, True

        def pack_into(self, *args):
            self.real.pack_into(*args)
            if self.armed:
                self.armed = False
                os.kill(os.getpid(), signal.SIGUSR1)

    real = probe._SLOT_FIELDS
    probe._SLOT_FIELDS = SignalInWrite(real)
    t = torch.ones(1)
    dist.all_reduce(t)  # its handler runs inside the probe's write of this record
    probe._SLOT_FIELDS = real
    ticks = []
    signal.signal(signal.SIGALRM, lambda *_: ticks.append(dist.all_reduce(torch.ones(1))))
    signal.setitimer(signal.ITIMER_REAL, 0.001, 0.001)
    for _ in range(300):
        dist.all_reduce(t)
    signal.setitimer(signal.ITIMER_REAL, 0)
    report(handler_calls=len(calls), ticks=len(ticks))
    dist.destroy_process_group()


def sleeping_thread():
    time.sleep(2)


def worker_sleep():
    import threading

    threading.Thread(target=sleeping_thread, daemon=True).start()
    print("ready", flush=True)
    time.sleep(2)  # the stack signal arrives here; PEP 475 resumes the sleep
    print("alive")
    report()


WORKERS = {"job": worker_job, "world1": worker_world1, "sleep": worker_sleep,
           "peer_dies": worker_peer_dies, "probe_breaks": worker_probe_breaks,
           "subgroups": worker_subgroups, "p2p": worker_p2p, "reentry": worker_reentry,
           "async": worker_async,
           "plain": report}

if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        WORKERS[sys.argv[2]](*sys.argv[3:])
        sys.exit(0)
    sys.exit(main())
