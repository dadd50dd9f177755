"""Installed into the PyTorch 2.14 test root by scripts/setup-pytorch214 (with a .pth file that
imports it at start-up); not part of ddprun.

Debian builds torch without libuv, yet TCPStore asks for libuv unless told otherwise, so every
init_process_group and torchrun fail with "use_libuv was requested but PyTorch was built without
libuv support". This makes libuv off the default, as a build without it should have it:
USE_LIBUV defaults to "0", and TCPStore's use_libuv keyword defaults to False. A caller that
passes use_libuv, or sets USE_LIBUV, gets what it asked for. Nothing else of PyTorch changes, and
torch is not imported here: the class is patched when torch.distributed is first imported (at
once where it was imported before this runs, as in a worker forked from ddprun's warm template,
which runs its site start-up after its fork). USE_LIBUV=0 comes from scripts/python-pytorch214,
so that this start-up sets no variable (which would make warm workers start cold)."""
import importlib.abc
import os
import sys

os.environ.setdefault("USE_LIBUV", "0")


def _default_libuv_off(tcp_store_class):
    original_init = tcp_store_class.__init__

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("use_libuv", False)
        original_init(self, *args, **kwargs)

    tcp_store_class.__init__ = __init__


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: once torch.distributed is importing, wraps its loader."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch.distributed":
            return None
        sys.meta_path.remove(self)
        from importlib.util import find_spec

        spec = find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        loader_exec = spec.loader.exec_module

        def exec_module(module):
            loader_exec(module)
            store = getattr(module, "TCPStore", None)
            if store is not None:
                _default_libuv_off(store)

        spec.loader.exec_module = exec_module
        return spec


if "torch.distributed" in sys.modules:  # imported already (a warm template's preload)
    _store = getattr(sys.modules["torch.distributed"], "TCPStore", None)
    if _store is not None:
        _default_libuv_off(_store)
else:
    sys.meta_path.insert(0, _PatchAfterImport())
