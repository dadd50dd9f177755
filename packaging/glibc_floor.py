#!/usr/bin/env python3
"""The oldest glibc that ELF programs run on, read from the programs (objdump, binutils):
  glibc_floor.py [--max 2.31] FILE_OR_FOLDER...
prints, for each ELF file (a folder: each ELF file under it), the newest glibc version it needs
and the symbols that need it, and exits 1, saying which file and why, when one needs a glibc
newer than --max. Used by scripts/package on the unpacked packages, and by
packaging/wheel/build_wheel.py for the wheel's platform tag.

What a program needs is in its version references (objdump -p): GLIBC_2.NN from any of
glibc's libraries, and GLIBC_ABI_DT_RELR, which the linker adds for packed relative
relocations (-z pack-relative-relocs) and which glibc has from 2.36 on."""
import argparse
import os
import re
import subprocess
import sys

# Version names that are not GLIBC_2.NN, with the glibc release that brought them.
MARKER_VERSIONS = {"GLIBC_ABI_DT_RELR": (2, 36)}


def objdump(flag, path):
    return subprocess.run(["objdump", flag, path], check=True, capture_output=True,
                          text=True).stdout


def text(version):
    return ".".join(map(str, version))


def glibc_floor(path):
    """(newest glibc version needed, what needs it) for one ELF file; (None, []) if none."""
    references = set(re.findall(r"^\s+0x[0-9a-f]+ 0x[0-9a-f]+ \d+ (GLIBC_\S+)$",
                                objdump("-p", path), re.M))
    needed = {}
    for name in references:
        match = re.fullmatch(r"GLIBC_(\d+)\.(\d+)(?:\.\d+)?", name)
        if match:
            needed[name] = (int(match[1]), int(match[2]))
        elif name in MARKER_VERSIONS:
            needed[name] = MARKER_VERSIONS[name]
    if not needed:
        return None, []
    floor = max(needed.values())
    names = sorted(n for n, v in needed.items() if v == floor)
    symbols = sorted(set(re.findall(r"\((" + "|".join(map(re.escape, names)) + r")\)\s+(\S+)$",
                                    objdump("-T", path), re.M)))
    why = [f"{symbol}@{name}" for name, symbol in symbols]
    why += [f"{name} (packed relative relocations)" for name in names if name in MARKER_VERSIONS]
    return floor, why


def is_elf(path):
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


def elf_files(paths):
    """(path, name to print) of each ELF file given or under a folder given (named from the
    folder on)."""
    for path in paths:
        if not os.path.isdir(path):
            yield path, path
            continue
        for folder, _, names in sorted(os.walk(path)):
            for name in sorted(names):
                found = os.path.join(folder, name)
                if not os.path.islink(found) and is_elf(found):
                    yield found, os.path.relpath(found, os.path.dirname(os.path.abspath(path)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max", help="fail if a file needs a glibc newer than this (2.NN)")
    parser.add_argument("paths", nargs="+", metavar="FILE_OR_FOLDER")
    args = parser.parse_args()
    limit = tuple(map(int, args.max.split("."))) if args.max else None
    too_new = []
    checked = 0
    for path, name in elf_files(args.paths):
        checked += 1
        floor, why = glibc_floor(path)
        if floor is None:
            print(f"{name}: needs no versioned glibc symbol")
            continue
        print(f"{name}: glibc >= {text(floor)} ({', '.join(why)})")
        if limit and floor > limit:
            too_new.append(name)
    if not checked:
        sys.exit(f"glibc_floor: no ELF file in {', '.join(args.paths)}")
    if too_new:
        print(f"glibc_floor: these need a glibc newer than {args.max} (what needs it is above): "
              f"{', '.join(too_new)}. The cause: a newer glibc function in our code (declare and "
              f"define it in packaging/glibc_compat.*), a static library built for a newer "
              f"glibc, or a build against the wrong glibc (cmake/DdpSysroot.cmake).")
        sys.exit(1)

if __name__ == "__main__":
    main()
