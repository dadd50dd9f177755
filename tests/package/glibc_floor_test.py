#!/usr/bin/env python3
"""packaging/glibc_floor.py --target debian11 fails on an ELF file that would not start on Debian
11 (a glibc, libstdc++ or libgcc_s version newer than Debian 11's, or a library that is not on
every Debian 11 system) and passes one that would; build_wheel.py's platform tag counts the NCCL
profiler plugin too. The ELF files are made here (gcc, binutils) against stand-in libraries that
define exactly the symbol versions under test, so that the test does not depend on this host's
own glibc or GCC."""
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGING = os.path.join(HERE, "..", "..", "packaging")
FLOOR = os.path.join(PACKAGING, "glibc_floor.py")
sys.path.insert(0, os.path.join(PACKAGING, "wheel"))
import build_wheel  # noqa: E402

# Stand-ins: library -> {version: [symbols]}, versions in the order they chain.
STAND_INS = {
    "libc.so.6": {"GLIBC_2.2.5": ["glibc_old"], "GLIBC_2.30": ["glibc_230"],
                  "GLIBC_2.34": ["glibc_234"]},
    "libstdc++.so.6": {"GLIBCXX_3.4": ["cxx_old"], "GLIBCXX_3.4.28": ["cxx_328"],
                       "GLIBCXX_3.4.30": ["cxx_330"], "CXXABI_1.3.12": ["abi_1312"],
                       "CXXABI_1.3.14": ["abi_1314"]},
    "libgcc_s.so.1": {"GCC_3.0": ["gcc_old"], "GCC_7.0.0": ["gcc_700"],
                      "GCC_12.0.0": ["gcc_1200"]},
    "libssl.so.3": {"OPENSSL_3.0.0": ["ssl_300"]},
}


def run(*argv, **kwargs):
    return subprocess.run(argv, capture_output=True, text=True, **kwargs)


class GlibcFloorTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.scratch = tempfile.TemporaryDirectory()
        cls.dir = cls.scratch.name
        cls.lib_dir = os.path.join(cls.dir, "stand-ins")
        os.mkdir(cls.lib_dir)
        for library, versions in STAND_INS.items():
            source = os.path.join(cls.dir, library + ".c")
            script = os.path.join(cls.dir, library + ".map")
            with open(source, "w") as f:
                for symbols in versions.values():
                    f.writelines(f"void {s}(void) {{}}\n" for s in symbols)
            with open(script, "w") as f:
                before = None
                for version, symbols in versions.items():
                    f.write(f"{version} {{ global: {'; '.join(symbols)}; }}"
                            f"{' ' + before if before else ''};\n")
                    before = version
            run("gcc", "-shared", "-fPIC", "-nostdlib", "-o", os.path.join(cls.lib_dir, library),
                f"-Wl,-soname,{library}", f"-Wl,--version-script,{script}", source, check=True)

    @classmethod
    def tearDownClass(cls):
        cls.scratch.cleanup()

    def elf(self, name, calls, folder=None):
        """A shared object at folder/name (this test's scratch folder by default) that calls
        the stand-ins' `calls` and loads only their libraries."""
        folder = folder or self.dir
        os.makedirs(folder, exist_ok=True)
        source = os.path.join(self.dir, name + ".c")
        with open(source, "w") as f:
            f.writelines(f"void {c}(void);\n" for c in calls)
            f.write("void entry(void) {" + "".join(f" {c}();" for c in calls) + " }\n")
        libraries = [lib for lib, versions in STAND_INS.items()
                     if any(c in s for s in versions.values() for c in calls)]
        path = os.path.join(folder, name)
        run("gcc", "-shared", "-fPIC", "-nostdlib", "-o", path, source, "-L", self.lib_dir,
            *[f"-l:{lib}" for lib in libraries], check=True)
        return path

    def check(self, path):
        return run(sys.executable, FLOOR, "--target", "debian11", path)

    def test_what_debian_11_has_passes(self):
        path = self.elf("fits", ["glibc_230", "cxx_328", "abi_1312", "gcc_700"])
        result = self.check(path)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertIn("glibc >= 2.30 (glibc_230@GLIBC_2.30)", result.stdout)
        self.assertIn("GLIBCXX_3.4.28; CXXABI_1.3.12; GCC_7.0.0", result.stdout)

    def test_a_newer_glibc_fails(self):
        result = self.check(self.elf("glibc", ["glibc_234"]))
        self.assertEqual(result.returncode, 1)
        self.assertIn("needs glibc GLIBC_2.34 (glibc_234@GLIBC_2.34); Debian 11 has GLIBC_2.31",
                      result.stdout)

    def test_a_newer_libstdcxx_fails(self):
        result = self.check(self.elf("glibcxx", ["cxx_old", "cxx_330"]))
        self.assertEqual(result.returncode, 1)
        self.assertIn("needs libstdc++ GLIBCXX_3.4.30 (cxx_330@GLIBCXX_3.4.30); Debian 11 has "
                      "GLIBCXX_3.4.28", result.stdout)
        result = self.check(self.elf("cxxabi", ["abi_1314"]))
        self.assertEqual(result.returncode, 1)
        self.assertIn("needs libstdc++ CXXABI_1.3.14 (abi_1314@CXXABI_1.3.14)", result.stdout)

    def test_a_newer_libgcc_fails(self):
        result = self.check(self.elf("gcc", ["gcc_old", "gcc_1200"]))
        self.assertEqual(result.returncode, 1)
        self.assertIn("needs libgcc_s GCC_12.0.0 (gcc_1200@GCC_12.0.0); Debian 11 has GCC_7.0.0",
                      result.stdout)

    def test_a_library_not_on_every_debian_11_fails(self):
        result = self.check(self.elf("ssl", ["glibc_old", "ssl_300"]))
        self.assertEqual(result.returncode, 1)
        self.assertIn("loads libssl.so.3: not among the libraries every Debian 11 system has",
                      result.stdout)

    def test_a_folder_is_checked_file_by_file(self):
        folder = os.path.join(self.dir, "unpacked")
        self.elf("a-fits", ["glibc_old"], folder)
        self.elf("b-newer", ["cxx_330"], folder)
        result = self.check(folder)
        self.assertEqual(result.returncode, 1)
        self.assertIn("these would not run on Debian 11 (why is above): unpacked/b-newer.",
                      result.stdout)

    def test_the_wheel_tag_counts_the_plugin(self):
        prefix = os.path.join(self.dir, "prefix")
        bin_dir = os.path.join(prefix, "bin")
        for program in build_wheel.PROGRAMS:
            self.elf(program, ["glibc_230"], bin_dir)
        files = build_wheel.shipped_elf_files(bin_dir)
        self.assertEqual(build_wheel.platform_tag(files)[:len("manylinux_2_30_")],
                         "manylinux_2_30_")
        self.elf(build_wheel.PLUGIN, ["glibc_234"], os.path.join(prefix, "lib"))
        files = build_wheel.shipped_elf_files(bin_dir)
        self.assertEqual(len(files), 3)
        self.assertEqual(build_wheel.platform_tag(files)[:len("manylinux_2_34_")],
                         "manylinux_2_34_")
        self.elf(build_wheel.PLUGIN, ["glibc_old", "cxx_328"], os.path.join(prefix, "lib"))
        self.assertTrue(build_wheel.platform_tag(files).startswith("linux_"))


if __name__ == "__main__":
    unittest.main()
