"""warm_pages.py OUT: for warm_start_test.cpp, run under ddprun --warm_start=always with one
worker. Waits (at most 30 s) until this worker alone maps at least 90% of the resident pages of
its anonymous private mappings, then writes that share to OUT/share.

A worker forked from ddprun's warm template shares the template's pages until one of them
writes them; the template takes the copies itself after the fork, so that the worker's own
writes need none (_ddprun_template._give_pages). An exec'd worker owns its pages from the start.
"""

import os
import struct
import sys
import time

import torch  # noqa: F401  (what the template imported)

_PAGE = os.sysconf("SC_PAGE_SIZE")
_PRESENT = 1 << 63
_EXCLUSIVE = 1 << 56  # /proc/PID/pagemap: "page exclusively mapped"


def exclusive_share():
    present = exclusive = 0
    with open("/proc/self/maps") as maps:
        ranges = []
        for line in maps:
            fields = line.split(None, 5)
            name = fields[5].strip() if len(fields) > 5 else ""
            if fields[1] != "rw-p" or (name and name not in ("[heap]", "[stack]")
                                       and not name.startswith("[anon")):
                continue
            ranges.append([int(x, 16) for x in fields[0].split("-")])
    with open("/proc/self/pagemap", "rb") as pagemap:
        for start, end in ranges:
            pagemap.seek(start // _PAGE * 8)
            data = pagemap.read((end - start) // _PAGE * 8)
            for (entry,) in struct.iter_unpack("Q", data):
                if entry & _PRESENT:
                    present += 1
                    exclusive += bool(entry & _EXCLUSIVE)
    return exclusive / max(present, 1)


deadline = time.monotonic() + 30
share = exclusive_share()
while share < 0.9 and time.monotonic() < deadline:
    time.sleep(0.05)
    share = exclusive_share()
with open(os.path.join(sys.argv[1], "share"), "w") as out:
    out.write("%.3f\n" % share)
