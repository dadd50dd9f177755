#!/usr/bin/env python3
"""The warm template's checks (worker/python/_ddprun_warm_checks.py) and the modules lists that
feed it (_ddprun_modules.py), without PyTorch and without ddprun: what a template must notice so
that a forked worker is an exec'd one (issue 34). The end-to-end cases are
tests/launcher/agent/warm_cases_test.cpp."""

import ctypes
import ctypes.util
import json
import os
import shutil
import socket
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "worker",
                                "python"))
import _ddprun_modules  # noqa: E402
import _ddprun_warm_checks as checks  # noqa: E402


class TempDir:
    def __enter__(self):
        self.path = tempfile.mkdtemp()
        return self.path

    def __exit__(self, *exc):
        shutil.rmtree(self.path)


def write(path, text):
    with open(path, "w") as f:
        f.write(text)


class WritesEnvironment(unittest.TestCase):
    def test_each_way_of_writing_is_seen_with_its_line(self):
        for source in ('import os\nos.environ["X"] = "1"\n',
                       'import os\nos.environ.update(X="1")\n',
                       'import os\nos.putenv("X", "1")\n',
                       'from os import environ\nenviron.setdefault("X", "1")\n',
                       'import os\ndel os.environ["X"]\n',
                       'import os\ndef f():\n    os.environ.pop("X")\n'):
            with self.subTest(source=source):
                self.assertGreaterEqual(checks.writes_environment(source, "t.py"), 2)

    def test_reading_is_not_writing(self):
        source = 'import os\nrank = os.environ["RANK"]\nx = os.environ.get("X")\nimport torch\n'
        self.assertEqual(checks.writes_environment(source, "t.py"), 0)
        self.assertEqual(checks.writes_environment("def (:\n", "t.py"), -1)

    def test_the_program_behind_ddprun_wrapper(self):
        with TempDir() as d:
            write(os.path.join(d, "train.py"), 'import os\nos.environ["A"] = "b"\n')
            path, source = checks.program_source(
                ["python", "-u", "-c", "WRAPPER", "--run_path", "train.py"], d)
            self.assertEqual(path, os.path.join(d, "train.py"))
            self.assertEqual(checks.writes_environment(source, path), 2)
            os.makedirs(os.path.join(d, "pkg"))
            write(os.path.join(d, "pkg", "__main__.py"), "print(1)\n")
            path, _ = checks.program_source(["python", "-c", "WRAPPER", "-m", "pkg"], d)
            self.assertEqual(path, os.path.join(d, "pkg", "__main__.py"))
            path, _ = checks.program_source(["python", "-u", "-m", "pkg", "-x"], d)
            self.assertEqual(path, os.path.join(d, "pkg", "__main__.py"))
            path, _ = checks.program_source(["python", "-m", "train"], d)
            self.assertEqual(path, os.path.join(d, "train.py"))


class EnvironmentReadsTest(unittest.TestCase):
    def import_module(self, folder, name, text, reads, delta=None):
        write(os.path.join(folder, name + ".py"), text)
        sys.path.insert(0, folder)
        original = type(os.environ)
        reads.start(name, delta or {})
        try:
            __import__(name)
        finally:
            reads.stop()
            sys.path.remove(folder)
            sys.modules.pop(name, None)
        self.assertIs(type(os.environ), original)

    def test_a_varying_variable_read_at_import_taints_and_names_the_reader(self):
        with TempDir() as d:
            reads = checks.EnvironmentReads(["RANK"])
            self.import_module(d, "reads_rank", 'import os\nR = os.environ.get("RANK", "0")\n',
                               reads)
            self.assertEqual(reads.tainted, ("RANK", "reads_rank"))

    def test_a_value_the_worker_would_not_see_differs(self):
        with TempDir() as d:
            os.environ.pop("WARM_CHECKS_X", None)
            reads = checks.EnvironmentReads([])
            self.import_module(d, "reads_x", 'import os\nX = os.getenv("WARM_CHECKS_X")\n', reads)
            self.assertIsNone(reads.tainted)
            self.assertIsNone(reads.differs({}))
            self.assertEqual(reads.differs({"WARM_CHECKS_X": "1"}),
                             ("WARM_CHECKS_X", "reads_x", "reads_x", None, "1"))

    def test_a_variable_of_the_delta_is_the_workers_too(self):
        with TempDir() as d:
            reads = checks.EnvironmentReads(["OMP_NUM_THREADS"])
            self.import_module(d, "reads_omp",
                               'import os\nN = os.environ.get("OMP_NUM_THREADS")\n', reads,
                               {"OMP_NUM_THREADS": "2"})
            self.assertIsNone(reads.tainted)
            self.assertEqual(reads.seen, {})

    def test_changes(self):
        self.assertEqual(checks.changes({"A": "1", "B": "2"}, {"A": "1", "B": "3", "C": "4"}),
                         {"B": "3", "C": "4"})
        self.assertEqual(checks.changes({"A": "1"}, {}), {"A": None})


class SnapshotTest(unittest.TestCase):
    def test_any_module_file_and_a_new_pth_file_are_changes(self):
        with TempDir() as d:
            write(os.path.join(d, "snap_mod.py"), "V = 1\n")
            sys.path.insert(0, d)
            site = os.path.join(d, "site")
            os.makedirs(site)
            folders = checks._site_folders
            checks._site_folders = lambda: [site]
            try:
                import snap_mod  # noqa: F401

                snapshot = checks.Snapshot()
                snapshot.add_modules()
                self.assertIsNone(snapshot.changed())
                write(os.path.join(site, "new.pth"), d + "\n")
                self.assertIn("new.pth was added", snapshot.changed())
                os.remove(os.path.join(site, "new.pth"))
                write(os.path.join(d, "snap_mod.py"), "V = 22\n")
                self.assertIn("snap_mod (", snapshot.changed())
            finally:
                checks._site_folders = folders
                sys.path.remove(d)
                sys.modules.pop("snap_mod", None)


class StartupFilesTest(unittest.TestCase):
    def test_shared_when_the_same_else_a_reason(self):
        with TempDir() as d:
            appended = open(os.path.join(d, "a.log"), "a")
            read_only = open(os.path.join(d, "a.log"))
            written = open(os.path.join(d, "w.log"), "w")
            left, right = socket.socketpair()
            try:
                ok = checks.StartupFiles([appended.fileno(), read_only.fileno()])
                self.assertIsNone(ok.problem([1, 2]))
                self.assertIn("given for ddprun's own use", ok.problem([appended.fileno()]))
                for f in (written, left):
                    self.assertIn("would open for itself",
                                  checks.StartupFiles([f.fileno()]).problem([1, 2]))
                closed = checks.StartupFiles([written.fileno()])
                written.close()
                self.assertIsNone(closed.problem([1, 2]))
            finally:
                for f in (appended, read_only, written, left, right):
                    f.close()


class CudaDriverTest(unittest.TestCase):
    def test_a_mapped_driver_library_is_seen(self):
        self.assertIsNone(checks.cuda_driver_problem([]))
        library = ctypes.util.find_library("m")
        source = next(p for p in ("/lib/x86_64-linux-gnu/" + str(library),
                                  "/usr/lib/x86_64-linux-gnu/" + str(library),
                                  "/lib64/" + str(library)) if os.path.exists(p))
        with TempDir() as d:
            fake = os.path.join(d, "libcuda.so.1")
            shutil.copy(source, fake)
            ctypes.CDLL(fake)  # stays mapped: the check reads this process's maps
            self.assertIn("loaded the CUDA driver", checks.cuda_driver_problem([]))


class ModulesListsTest(unittest.TestCase):
    def test_lists_carry_the_environment_and_ranks_that_differ_are_divergent(self):
        saved = dict(os.environ)
        watch = _ddprun_modules.EnvironmentWatch()
        sys.meta_path.insert(0, watch)
        try:
            with TempDir() as d:
                os.environ["WARM_LIST_X"] = "2"
                write(os.path.join(d, "after_change.py"), "")
                sys.path.insert(0, d)
                import after_change  # noqa: F401

                sys.path.remove(d)
                path = os.path.join(d, "modules.txt")
                _ddprun_modules.ModuleReport(path, watch).write()
                text = open(path).read()
                self.assertEqual(os.stat(path).st_mode & 0o777, 0o600)  # values the program set
                mark = _ddprun_modules.ENV_MARK + json.dumps({"WARM_LIST_X": "2"})
                self.assertIn(mark + "\nafter_change\t", text)
                other = os.path.join(d, "other.txt")
                write(other, text.replace('"2"', '"3"'))
                triples = {name: delta for name, _, delta in
                           _ddprun_modules.read_lists([path, other])}
                self.assertEqual(triples["after_change"], _ddprun_modules.DIVERGENT)
                self.assertEqual(triples["os"], {})
                triples = {name: delta for name, _, delta in _ddprun_modules.read_lists([path])}
                self.assertEqual(triples["after_change"], {"WARM_LIST_X": "2"})
        finally:
            sys.meta_path.remove(watch)
            sys.modules.pop("after_change", None)
            os.environ.clear()
            os.environ.update(saved)

    def test_what_the_framework_set_itself_is_no_change(self):
        # A survivor imported the framework's compiler itself (which set its cache folder) and
        # then a lazy module; a replacement forked from a template that held the compiler starts
        # with the folder set, so its list has no change before the same lazy module.
        with TempDir() as d:
            survivor, replacement = os.path.join(d, "s.txt"), os.path.join(d, "r.txt")
            mark = _ddprun_modules.ENV_MARK
            write(survivor, "torch\tt.py\n" + mark + '{"CACHE": "/tmp/c"}\n' + "lazy\tl.py\n")
            write(replacement, "torch\tt.py\nlazy\tl.py\n")
            lists = [survivor, replacement]
            triples = {name: delta for name, _, delta in _ddprun_modules.read_lists(lists)}
            self.assertEqual(triples["lazy"], _ddprun_modules.DIVERGENT)
            triples = {name: delta for name, _, delta in
                       _ddprun_modules.read_lists(lists, {"CACHE": "/tmp/c"})}
            self.assertEqual(triples["lazy"], {})
            triples = {name: delta for name, _, delta in
                       _ddprun_modules.read_lists(lists, {"CACHE": "/elsewhere"})}
            self.assertEqual(triples["lazy"], _ddprun_modules.DIVERGENT)


class ProcessStringsTest(unittest.TestCase):
    def test_cmdline_and_environ_are_exactly_the_workers(self):
        with TempDir() as d:
            script = os.path.join(d, "child.py")
            write(script, "import sys\nsys.path.insert(0, %r)\n" % checks.__file__.rsplit("/", 1)[0]
                  + "import _ddprun_warm_checks as c\n"
                  "c.set_process_strings(['python3', 'w.py', 'a b'], {'K': 'V'})\n"
                  "print(repr(open('/proc/self/cmdline','rb').read()))\n"
                  "print(repr(open('/proc/self/environ','rb').read()))\n")
            import subprocess

            out = subprocess.run([sys.executable, script, " " * 200], capture_output=True,
                                 text=True, check=True, env={"PAD": " " * 200}).stdout
            self.assertEqual(out.splitlines(), [repr(b"python3\0w.py\0a b\0"), repr(b"K=V\0")])


if __name__ == "__main__":
    unittest.main()
