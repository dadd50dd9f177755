"""What a worker imported, for ddprun's warm template (_ddprun_template.py).

The probe side (ModuleReport, EnvironmentWatch): a worker whose agent warms restarts
(DDPRUN_MODULES_FILE set) writes the modules it has imported to that file, one "name<TAB>file"
line each in the order they were first imported: after its 1st, 2nd, 4th, 8th... recorded
collective when more were imported since (PyTorch 2.x imports much of itself lazily on the first
DDP step), and at exit. The file is replaced whole (written beside it, then renamed), so a
reader never sees half. Where the program had changed its environment before a module was
imported (os.environ["OMP_NUM_THREADS"] = "2" before `import torch`), a line
"<TAB>env<TAB>{json}" comes before that module's: the variables set (a string) or removed
(null) since the worker started, which hold for the modules after it until the next such line.

The template side (read_lists, installed): which of those modules the template may import.
Only modules loaded from installed locations (the standard library, site-packages and
dist-packages folders) qualify, never the program's own modules from its folder or the working
directory, whose import may have side effects.
"""

import os
import sys

import _ddprun_contract as _contract  # names only

# Modules that are the worker's own start-up, never the template's to import.
_NEVER = ("__main__", "__mp_main__", "sitecustomize", "usercustomize")
# Writes after this many recorded collectives (then doubling), when sys.modules grew.
_FIRST_WRITE = 1
_LAST_DOUBLING = 1 << 20
# The line that gives the environment the modules after it were imported in.
ENV_MARK = "\tenv\t"


class EnvironmentWatch:
    """A sys.meta_path finder that finds nothing: notes, for each module the program imports,
    how its environment then differed from the one it started with (ddprun's own variables
    aside). Costs a dict comparison per module imported."""

    def __init__(self):
        environ = os.environ._data  # bytes -> bytes, what putenv was given
        self._start = dict(environ)
        self._seen = dict(environ)
        ours = self._start.get(os.fsencode(_contract.FR_OLD_NAMES), b"").split(b",")
        self._ours = set(filter(None, ours))  # the probe drops these (Flight Recorder names)
        self.deltas = [{}]  # id -> the delta: variable -> value (None: removed)
        self.delta_of = {}  # module name -> id of the delta it was imported in

    def _ignored(self, key):
        return key.startswith(b"DDPRUN_") or key in self._ours

    def current(self):
        """The id of the environment now, noting a new one when it changed."""
        environ = os.environ._data
        if environ != self._seen:
            self._seen = dict(environ)
            delta = {}
            for key, value in environ.items():
                if self._start.get(key) != value and not self._ignored(key):
                    delta[os.fsdecode(key)] = os.fsdecode(value)
            for key in self._start:
                if key not in environ and not self._ignored(key):
                    delta[os.fsdecode(key)] = None
            if delta != self.deltas[-1]:
                self.deltas.append(delta)
        return len(self.deltas) - 1

    def find_spec(self, name, path=None, target=None):
        try:
            self.delta_of.setdefault(name, self.current())
        except Exception:  # never into the program's import
            pass
        return None


def _origin(module):
    """The file a module was loaded from; "" for a built-in or a namespace package."""
    try:
        path = getattr(module, "__file__", None)
        return path if isinstance(path, str) else ""
    except Exception:  # a module object whose attributes raise
        return ""


class ModuleReport:
    """Writes sys.modules to `path` now and then (see the module's docstring). Never raises:
    the program must not notice it."""

    def __init__(self, path, watch=None):
        self._path = path
        self._watch = watch  # an EnvironmentWatch, or None
        self._count = 0
        self._next = _FIRST_WRITE
        self._written = 0  # len(sys.modules) at the last write
        self._writing = False  # a signal handler's collective during a write skips
        self._pid = os.getpid()  # a forked child (a DataLoader worker) writes nothing

    def collective(self):
        """Called for each recorded collective; cheap except at the doublings."""
        self._count += 1
        if self._count < self._next:
            return
        self._next = min(self._next * 2, self._count + _LAST_DOUBLING)
        if len(sys.modules) != self._written:
            self.write()

    def write(self):
        if self._writing or os.getpid() != self._pid:
            return
        self._writing = True
        try:
            modules = list(sys.modules.items())
            lines = []
            delta = 0  # a module the watch did not see was imported in the one before it's
            written = 0
            for name, module in modules:
                if self._watch is not None:
                    delta = self._watch.delta_of.get(name, delta)
                if module is None or name in _NEVER or name.startswith("_ddprun_"):
                    continue
                file = _origin(module)
                if "\t" in name or "\n" in name or "\t" in file or "\n" in file:
                    continue
                if delta != written:
                    lines.append(ENV_MARK + _json_line(self._watch.deltas[delta]))
                    written = delta
                lines.append("%s\t%s\n" % (name, file))
            partial = "%s.%d.partial" % (self._path, self._pid)
            # Only this user reads it: the environment marks hold values the program set.
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            with open(fd, "w", encoding="utf-8", errors="surrogateescape") as out:
                out.writelines(lines)
            os.replace(partial, self._path)
            self._written = len(modules)
        except Exception:
            pass
        finally:
            self._writing = False


def _json_line(delta):
    import json

    return json.dumps(delta, sort_keys=True, ensure_ascii=True) + "\n"


# read_lists' delta for a module the lists saw imported in different environments.
DIVERGENT = "divergent"


def read_lists(paths, unchanged=None):
    """The (name, file, delta) triples of the lists at `paths`, each name once, in first-seen
    order (the first list's order, then what the others add). delta is the environment
    change the module was imported in (a dict: variable -> value, None for removed), or
    DIVERGENT when two lists (two ranks) imported it in different ones. A change to a value
    in `unchanged` (variable -> value: what the framework's own imports set, in every process
    that imports it) is no change: a worker forked after those imports starts with it, one
    that imported them itself set it on the way. Missing or unreadable lists are skipped."""
    import json

    normal = {}  # a list's delta line -> the same without `unchanged`'s entries

    def normalized(line):
        if not unchanged or line == "{}":
            return line
        if line not in normal:
            try:
                delta = json.loads(line)
                if isinstance(delta, dict):
                    delta = {k: v for k, v in delta.items()
                             if k not in unchanged or unchanged[k] != v}
                    normal[line] = json.dumps(delta, sort_keys=True, ensure_ascii=True)
                else:
                    normal[line] = line
            except ValueError:
                normal[line] = line
        return normal[line]

    seen = {}
    for path in paths:
        try:
            with open(path, encoding="utf-8", errors="surrogateescape") as text:
                delta = "{}"
                for line in text:
                    line = line.rstrip("\n")
                    if line.startswith(ENV_MARK):
                        delta = normalized(line[len(ENV_MARK):])
                        continue
                    name, tab, file = line.partition("\t")
                    if not tab or not name:
                        continue
                    if name not in seen:
                        seen[name] = [file, delta]
                    elif seen[name][1] != delta:
                        seen[name][1] = DIVERGENT
        except OSError:
            continue
    triples = []
    for name, (file, delta) in seen.items():
        if delta != DIVERGENT:
            try:
                delta = json.loads(delta)
            except ValueError:
                delta = DIVERGENT
            if not isinstance(delta, dict):
                delta = DIVERGENT
        triples.append((name, file, delta))
    return triples


def _real_folder(path):
    return os.path.realpath(os.path.abspath(path)) if path else ""


def installed_roots():
    """The folders of installed code: the standard library, and each site-packages or
    dist-packages folder Python knows of or has on sys.path."""
    import site
    import sysconfig

    roots = set()
    paths = sysconfig.get_paths()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        if paths.get(key):
            roots.add(_real_folder(paths[key]))
    try:
        roots.update(_real_folder(p) for p in site.getsitepackages())
        roots.add(_real_folder(site.getusersitepackages()))
    except Exception:  # a virtualenv's old site.py lacks them
        pass
    for entry in sys.path:
        if os.path.basename(entry.rstrip("/")) in ("site-packages", "dist-packages"):
            roots.add(_real_folder(entry))
    roots.discard("")
    return sorted(roots)


def _deepest(path, folders):
    """The longest of `folders` that contains `path` (a real path), or ""."""
    best = ""
    for folder in folders:
        inside = path == folder or path.startswith(folder.rstrip("/") + "/")
        if inside and len(folder) > len(best):
            best = folder
    return best


def installed(name, file, roots, own_folders):
    """Whether the module `name`, loaded from `file` ("" for a built-in), is installed code:
    a built-in module, or a file whose deepest containing folder among the installed roots and
    the program's own folders (its script's folder, the working directory) is an installed
    root. The program's folder wins a tie."""
    if name in _NEVER or name.startswith("_ddprun_"):
        return False
    if not file:
        return name in sys.builtin_module_names
    real = _real_folder(file)
    root = _deepest(real, roots)
    if not root:
        return False
    own = _deepest(real, own_folders)
    return len(own) < len(root)
