#!/usr/bin/env python3
"""What ELF programs need from the system they run on, read from the programs (objdump, binutils):
  glibc_floor.py [--target debian11] FILE_OR_FOLDER...
prints, for each ELF file (a folder: each ELF file under it), the newest glibc version it needs
and the symbols that need it, what it needs from GCC's runtime libraries (libstdc++, libgcc_s)
and the libraries it loads (NEEDED); with --target, exits 1, saying which file and why, when one
needs more than the target system has. Used by scripts/package on the unpacked packages, and by
packaging/wheel/build_wheel.py for the wheel's platform tag.

What a program needs is in its dynamic section and its version references (objdump -p): the
libraries it loads (NEEDED), and for each the symbol versions it takes from it: GLIBC_2.NN from
glibc's libraries, GLIBCXX_3.4.NN and CXXABI_1.3.NN from libstdc++, GCC_N.N.N from libgcc_s, and
GLIBC_ABI_DT_RELR, which the linker adds for packed relative relocations (-z pack-relative-relocs)
and which glibc has from 2.36 on. A library that is not on the target at all, or a version newer
than the target's copy of it has, and the program does not start there."""
import argparse
import os
import re
import subprocess
import sys

# Version names that are not FAMILY_N.N, with the release of their family that brought them.
MARKER_VERSIONS = {"GLIBC_ABI_DT_RELR": ("GLIBC", (2, 36))}
# Version names of GCC's runtime that name no release: in every libstdc++ since GCC 6.
UNNUMBERED_VERSIONS = {"CXXABI_TM_1"}
# The version families whose newest release the targets below bound.
FAMILIES = ("GLIBC", "GLIBCXX", "CXXABI", "GCC")
# Where each family comes from, for the messages.
FAMILY_LIBRARY = {"GLIBC": "glibc", "GLIBCXX": "libstdc++", "CXXABI": "libstdc++",
                  "GCC": "libgcc_s"}

# glibc's own libraries: on every system with that glibc (and the loader under its two names).
GLIBC_LIBRARIES = {"libc.so.6", "libm.so.6", "libpthread.so.0", "libdl.so.2", "librt.so.1",
                   "libutil.so.1", "libresolv.so.2", "libnsl.so.1",
                   "ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1"}


class Target:
    """A system the packages promise to run on: the libraries every installation of it has
    (and that the manylinux policy lets a wheel take from the host), and the newest version of
    each family that its copies of them define."""

    def __init__(self, name, newest, libraries):
        self.name = name
        self.newest = newest  # family -> version tuple
        self.libraries = libraries


# Debian 11 (bullseye), the packages' promise (docs/install.md): glibc 2.31 (libc6), GCC 10's
# libstdc++6 (10.2.1: GLIBCXX_3.4.28, CXXABI_1.3.12) and libgcc-s1 (GCC_7.0.0, the newest node
# up to GCC 11; GCC 12 added GCC_12.0.0), all three Priority: required there. Also Ubuntu
# 20.04's, and manylinux_2_31's.
TARGETS = {
    "debian11": Target("Debian 11", {"GLIBC": (2, 31), "GLIBCXX": (3, 4, 28),
                                     "CXXABI": (1, 3, 12), "GCC": (7, 0, 0)},
                       GLIBC_LIBRARIES | {"libstdc++.so.6", "libgcc_s.so.1"}),
}


def objdump(flag, path):
    return subprocess.run(["objdump", flag, path], check=True, capture_output=True,
                          text=True).stdout


def text(version):
    return ".".join(map(str, version))


def parse_version(name):
    """(family, version tuple) of a version name; (None, None) for an unknown one."""
    if name in MARKER_VERSIONS:
        return MARKER_VERSIONS[name]
    match = re.fullmatch(r"(GLIBC|GLIBCXX|CXXABI|GCC)_(\d+(?:\.\d+)*)", name)
    if not match:
        return None, None
    return match[1], tuple(int(part) for part in match[2].split("."))


class Needs:
    """What one ELF file needs: the libraries it loads, and the symbol versions it takes from
    each (library -> names)."""

    def __init__(self, path):
        dynamic = objdump("-p", path)
        self.path = path
        self.libraries = re.findall(r"^\s*NEEDED\s+(\S+)$", dynamic, re.M)
        self.versions = {}
        library = None
        for line in dynamic.splitlines():
            required = re.match(r"^\s+required from (\S+):$", line)
            reference = re.match(r"^\s+0x[0-9a-f]+ 0x[0-9a-f]+ \d+ (\S+)$", line)
            if required:
                library = required[1]
            elif reference and library:
                self.versions.setdefault(library, set()).add(reference[1])
            elif line and not line[0].isspace():
                library = None  # the section after the version references
        self._symbols = None

    def newest(self, family):
        """(newest version of the family needed, its names); (None, []) if none."""
        found = {}
        for names in self.versions.values():
            for name in names:
                kind, version = parse_version(name)
                if kind == family:
                    found[name] = version
        if not found:
            return None, []
        top = max(found.values())
        return top, sorted(n for n, v in found.items() if v == top)

    def unknown_versions(self):
        """Version names taken from GCC's runtime or glibc that no family bound judges."""
        return sorted(f"{name} (from {library})" for library, names in self.versions.items()
                      for name in names
                      if parse_version(name)[0] is None and name not in UNNUMBERED_VERSIONS and
                      (library in GLIBC_LIBRARIES or library.startswith(("libstdc++", "libgcc_s"))))

    def why(self, names):
        """The symbols (or the marker) that need these version names."""
        if self._symbols is None:
            self._symbols = objdump("-T", self.path)
        symbols = sorted(set(re.findall(
            r"\((" + "|".join(map(re.escape, names)) + r")\)\s+(\S+)$", self._symbols, re.M)))
        why = [f"{symbol}@{name}" for name, symbol in symbols]
        why += [f"{name} (packed relative relocations)" for name in names
                if name in MARKER_VERSIONS]
        return why


def glibc_floor(path):
    """(newest glibc version needed, what needs it) for one ELF file; (None, []) if none."""
    needs = Needs(path)
    floor, names = needs.newest("GLIBC")
    return floor, needs.why(names) if names else []


def problems(needs, target):
    """Why the file would not run on the target: empty when it would."""
    found = []
    missing = [lib for lib in needs.libraries if lib not in target.libraries]
    if missing:
        found.append(f"loads {', '.join(missing)}: not among the libraries every {target.name} "
                     f"system has ({', '.join(sorted(target.libraries))})")
    for family in FAMILIES:
        version, names = needs.newest(family)
        if version and version > target.newest[family]:
            found.append(f"needs {FAMILY_LIBRARY[family]} {names[0]} ({', '.join(needs.why(names))}); "
                         f"{target.name} has {family}_{text(target.newest[family])}")
    unknown = needs.unknown_versions()
    if unknown:
        found.append(f"needs versions {target.name} may not have: {', '.join(unknown)}")
    return found


def describe(needs):
    """One line of what the file needs."""
    parts = []
    floor, names = needs.newest("GLIBC")
    parts.append(f"glibc >= {text(floor)} ({', '.join(needs.why(names))})" if floor
                 else "no versioned glibc symbol")
    for family in FAMILIES[1:]:
        version, names = needs.newest(family)
        if version:
            parts.append(f"{family}_{text(version)}")
    parts.append("loads " + (", ".join(needs.libraries) or "nothing"))
    return "; ".join(parts)


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
    parser.add_argument("--target", choices=sorted(TARGETS),
                        help="fail if a file needs what this system does not have")
    parser.add_argument("paths", nargs="+", metavar="FILE_OR_FOLDER")
    args = parser.parse_args()
    target = TARGETS[args.target] if args.target else None
    failed = []
    checked = 0
    for path, name in elf_files(args.paths):
        checked += 1
        needs = Needs(path)
        print(f"{name}: {describe(needs)}")
        for problem in problems(needs, target) if target else []:
            print(f"{name}: {problem}")
            failed.append(name)
    if not checked:
        sys.exit(f"glibc_floor: no ELF file in {', '.join(args.paths)}")
    if failed:
        print(f"glibc_floor: these would not run on {target.name} (why is above): "
              f"{', '.join(sorted(set(failed)))}. The cause: a newer glibc function in our code "
              f"(declare and define it in packaging/glibc_compat.*), a static library built for "
              f"a newer glibc, a build against the wrong glibc (cmake/DdpSysroot.cmake), or a "
              f"library linked dynamically that a DDP_PORTABLE build links in (libstdc++, "
              f"libgcc_s, OpenSSL).")
        sys.exit(1)


if __name__ == "__main__":
    main()
