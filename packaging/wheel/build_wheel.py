#!/usr/bin/env python3
"""Builds the ddprun wheel from built programs: build_wheel.py --bin-dir build-package/bin
--dist-dir dist --version 0.1.0 [--strip]. Run by scripts/package and by tests/package.
ddprun's Python probe is taken from beside the programs (<bin-dir>/../share/ddprun/python, where
the build puts it) and installed where ddprun looks for it: <prefix>/share/ddprun/python.

The platform tag is read from every ELF file the wheel ships (the programs and the NCCL profiler
plugin), so that it is never a claim they do not meet: manylinux_2_NN_x86_64 (PEP 600) when
every shared library they load is glibc's own (libc, libm, libpthread, libdl, librt, the loader:
what any system with that glibc has), NN being the newest glibc they need
(packaging/glibc_floor.py: the version references, GLIBC_2.NN and GLIBC_ABI_DT_RELR);
linux_x86_64 otherwise (a build without DDP_PORTABLE=ON links libstdc++ and OpenSSL
dynamically). Needs objdump (binutils) and Debian's python3-setuptools and python3-wheel."""
import argparse
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile

PROGRAMS = ("ddprun", "ddpstore")
PLUGIN = "libddprun-nccl-profiler.so"  # in <bin-dir>/../lib, when it was built
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from glibc_floor import GLIBC_LIBRARIES, Needs  # noqa: E402 (packaging/glibc_floor.py)


def plugin_path(bin_dir):
    """ddprun's NCCL profiler plugin beside the programs, or None when it was not built."""
    path = os.path.join(bin_dir, "..", "lib", PLUGIN)
    return path if os.path.isfile(path) else None


def shipped_elf_files(bin_dir):
    """Every ELF file the wheel ships: the programs, and the plugin and the probe's native
    wrapper when they were built."""
    plugin = plugin_path(bin_dir)
    around = os.path.join(bin_dir, "..", "share", "ddprun", "python", "_ddprun_around.abi3.so")
    return [os.path.join(bin_dir, name) for name in PROGRAMS] + ([plugin] if plugin else []) + \
        ([around] if os.path.isfile(around) else [])


def platform_tag(files):
    """manylinux_2_NN_<arch> if the files qualify, else linux_<arch>; prints why."""
    arch = platform.machine()
    newest = (2, 17)  # the oldest manylinux (manylinux2014)
    for path in files:
        needs = Needs(path)
        others = sorted(set(needs.libraries) - GLIBC_LIBRARIES)
        if others:
            print(f"build_wheel: {os.path.basename(path)} loads {', '.join(others)} from the host: "
                  f"tagged linux_{arch} (build with -DDDP_PORTABLE=ON for a manylinux wheel)")
            return f"linux_{arch}"
        floor, _ = needs.newest("GLIBC")
        newest = max(newest, floor or newest)
    print(f"build_wheel: the programs and the plugin need only glibc >= {newest[0]}.{newest[1]}")
    return f"manylinux_{newest[0]}_{newest[1]}_{arch}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin-dir", required=True, help="where ddprun and ddpstore are")
    parser.add_argument("--dist-dir", required=True, help="where the wheel goes")
    parser.add_argument("--version", required=True, help="the project's version")
    parser.add_argument("--strip", action="store_true",
                        help="strip the programs' symbols in the wheel (as the .deb's are)")
    args = parser.parse_args()
    programs = [os.path.join(args.bin_dir, name) for name in PROGRAMS]
    missing = [p for p in programs if not os.access(p, os.X_OK)]
    if missing:
        sys.exit(f"build_wheel: not built: {', '.join(missing)} (build the targets "
                 f"{' '.join(PROGRAMS)} first)")
    probe_dir = os.path.join(args.bin_dir, "..", "share", "ddprun", "python")
    # Its .py files and its native wrapper (_ddprun_around.abi3.so, CPython's stable ABI).
    probe = sorted(f for f in os.listdir(probe_dir) if f.endswith((".py", ".abi3.so"))) \
        if os.path.isdir(probe_dir) else []
    if "sitecustomize.py" not in probe:
        sys.exit(f"build_wheel: ddprun's Python probe is not in {probe_dir} (build ddprun first)")
    tag = platform_tag(shipped_elf_files(args.bin_dir))
    dist_dir = os.path.abspath(args.dist_dir)
    os.makedirs(dist_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ddprun-wheel-") as stage:
        shutil.copy(os.path.join(HERE, "setup.py"), stage)
        shutil.copy(os.path.join(HERE, "README.md"), stage)
        os.mkdir(os.path.join(stage, "programs"))
        for path in programs:
            staged = os.path.join(stage, "programs", os.path.basename(path))
            shutil.copy(path, staged)
            if args.strip:
                subprocess.run(["strip", "--strip-unneeded", staged], check=True)
        # ddprun's NCCL profiler plugin, beside the programs in <bin-dir>/../lib, goes to
        # <prefix>/lib, where ddprun looks for it (../lib from its own place).
        plugin = plugin_path(args.bin_dir)
        if plugin:
            os.mkdir(os.path.join(stage, "plugin"))
            staged = os.path.join(stage, "plugin", os.path.basename(plugin))
            shutil.copy(plugin, staged)
            if args.strip:
                subprocess.run(["strip", "--strip-unneeded", staged], check=True)
        # ddprun's Python package (ddprun.inplace), beside the probe in the build.
        package_dir = os.path.join(args.bin_dir, "..", "share", "ddprun", "python-package",
                                   "ddprun")
        if not os.path.isfile(os.path.join(package_dir, "inplace.py")):
            sys.exit(f"build_wheel: ddprun.inplace is not in {package_dir} (build ddprun first)")
        shutil.copytree(package_dir, os.path.join(stage, "ddprun"),
                        ignore=shutil.ignore_patterns("__pycache__"))
        os.mkdir(os.path.join(stage, "probe"))
        for name in probe:
            staged = os.path.join(stage, "probe", name)
            shutil.copy(os.path.join(probe_dir, name), staged)
            if args.strip and name.endswith(".so"):
                subprocess.run(["strip", "--strip-unneeded", staged], check=True)
        env = dict(os.environ, DDP_WHEEL_VERSION=args.version, DDP_WHEEL_PLATFORM=tag,
                   PYTHONWARNINGS="ignore")  # setuptools deprecates setup.py itself
        subprocess.run([sys.executable, "setup.py", "-q", "bdist_wheel", "--dist-dir", dist_dir],
                       cwd=stage, env=env, check=True, stdout=subprocess.DEVNULL)
    print(f"build_wheel: {dist_dir}/ddprun-{args.version}-py3-none-{tag}.whl")


if __name__ == "__main__":
    main()
