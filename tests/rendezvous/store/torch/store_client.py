"""PyTorch's TCPStore client (1.13's 1.x dialect, or 2.x's) against a store at
127.0.0.1:PORT: every operation both have, with the same answers. Prints OK and exits 0 when
every check passed."""
import datetime
import sys
import threading

import torch.distributed as dist

port = int(sys.argv[1])
timeout = datetime.timedelta(seconds=20)
# Two clients of a world of 2: each ADDs 1 to init/ while connecting.
store = dist.TCPStore("127.0.0.1", port, 2, False, timeout=timeout)
other = dist.TCPStore("127.0.0.1", port, 2, False, timeout=timeout)

store.set("k1", "v1")
assert store.get("k1") == b"v1"
store.set("bin", b"\x00\x01\xff")
assert other.get("bin") == b"\x00\x01\xff"

assert store.add("counter", 5) == 5
assert other.add("counter", -2) == 3
assert store.get("counter") == b"3"

assert store.compare_set("cas", "", "first") == b"first"
assert store.compare_set("absent", "expected", "desired") == b"expected"
assert store.compare_set("cas", "first", "second") == b"second"
assert store.compare_set("cas", "wrong", "third") == b"second"

store.wait(["k1", "counter"])
setter = threading.Thread(target=lambda: other.set("late", "1"))
setter.start()
store.wait(["late"], datetime.timedelta(seconds=20))
setter.join()
try:
    store.wait(["never"], datetime.timedelta(milliseconds=300))
    raise AssertionError("wait for a missing key returned")
except RuntimeError as e:
    assert "imeout" in str(e), e
other.set_timeout(datetime.timedelta(seconds=20))

# init/ (unprefixed), k1, bin, counter, cas, late
assert store.num_keys() == 6, store.num_keys()
assert store.delete_key("cas") is True
assert store.delete_key("cas") is False
assert other.num_keys() == 5
print("OK", flush=True)
