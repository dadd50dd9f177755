"""ddprun's entry into its Python workers: ddprun puts this folder first on their PYTHONPATH, so
site.py imports this module at start-up, in place of the user's sitecustomize.

It leaves the worker as torchrun would have started it, then starts ddprun's probe:
1. drops this folder from sys.path and gives PYTHONPATH back the user's value (ddprun keeps it
   in DDPRUN_PYTHONPATH, or leaves that unset when PYTHONPATH was): the program and its
   children see what they would see under torchrun;
2. runs the user's own sitecustomize, if one is further on sys.path (Debian ships one), as
   site.py would: an error in it is printed as site.py prints it, and start-up goes on. Then
   sys.modules["sitecustomize"] is the user's module, or absent when there is none;
3. unless DDPRUN_PYTHON_PROBE is "0", installs the probe (_ddprun_probe.py, beside this file).
   If that fails, one line says so and the program runs as if there were no probe.
Never raises into site.py, except the ImportError that tells it there is no sitecustomize.
"""

import os
import sys

import _ddprun_contract  # beside this file, first on sys.path until _drop_folder

# Only where ddprun recovers in place (the variable is there): no other worker imports it.
_ddprun_package = None
if _ddprun_contract.INPLACE_GENERATION in os.environ:
    import _ddprun_package


def _drop_folder(folder):
    """Removes `folder` from sys.path, and gives PYTHONPATH back the user's value: exactly the
    one ddprun kept in DDPRUN_PYTHONPATH ("" and ":" included: an empty entry is the current
    folder for a child), else (the user's was unset, or ddprun did not start us) PYTHONPATH
    without `folder`, unset when nothing is left."""
    def is_folder(entry):
        return bool(entry) and os.path.realpath(os.path.abspath(entry)) == folder

    sys.path[:] = [entry for entry in sys.path if not is_folder(entry)]
    users = os.environ.pop(_ddprun_contract.USER_PYTHONPATH, None)
    if users is not None:
        os.environ["PYTHONPATH"] = users
        return
    python_path = os.environ.get("PYTHONPATH")
    if python_path is None:
        return
    kept = [entry for entry in python_path.split(os.pathsep) if not is_folder(entry)]
    if any(kept):
        os.environ["PYTHONPATH"] = os.pathsep.join(kept)
    else:
        del os.environ["PYTHONPATH"]


def _run_user_sitecustomize():
    """Imports the next sitecustomize on sys.path; returns it, or None when there is none or it
    failed (reported as site.py's execsitecustomize reports it)."""
    import importlib

    del sys.modules[__name__]  # so that the import below finds the next one
    try:
        try:
            return importlib.import_module("sitecustomize")
        except ImportError as error:
            if error.name != "sitecustomize":
                raise
            return None
    except Exception as error:
        if sys.flags.verbose:
            sys.excepthook(*sys.exc_info())
        else:
            sys.stderr.write(
                "Error in sitecustomize; set PYTHONVERBOSE for traceback:\n"
                "%s: %s\n" % (error.__class__.__name__, error)
            )
        return None


def _import_probe():
    """Imports the probe while this folder is still on sys.path: (module, None) or (None, the
    error)."""
    try:
        import _ddprun_probe

        return _ddprun_probe, None
    except Exception as error:
        return None, error


def _start_probe(probe, error):
    """Installs the probe; a failure (or `error`, its import's) turns it off, in one line. A
    worker forked from ddprun's warm template installs it itself once its site start-up has
    run (the template set probe.install_after_site)."""
    if error is None and getattr(probe, "install_after_site", False):
        return
    if error is None:
        try:
            probe.install()
        except Exception as install_error:
            error = install_error
    if error is None:
        return
    reason = " ".join(("%s: %s" % (type(error).__name__, error)).split())
    try:
        sys.stderr.write("ddprun: the Python probe is off in this worker: %s\n" % reason)
    except Exception:
        pass


def _main():
    """Returns the user's sitecustomize module, or None."""
    folder = os.path.dirname(os.path.realpath(__file__))
    probe_on = os.environ.get(_ddprun_contract.PYTHON_PROBE) != "0"
    if not probe_on:  # nothing of ddprun's stays in such a worker
        sys.modules.pop("_ddprun_contract", None)
        sys.modules.pop("_ddprun_package", None)
    probe, error = _import_probe() if probe_on else (None, None)
    _drop_folder(folder)
    if _ddprun_package is not None:
        _ddprun_package.offer(folder)
    user_module = _run_user_sitecustomize()
    if probe_on:  # after the user's sitecustomize: the probe copes with torch imported already
        _start_probe(probe, error)
    return user_module


_user_sitecustomize = _main()
if _user_sitecustomize is None:
    # What site.py sees under a plain python without a sitecustomize: the import machinery
    # then removes this module from sys.modules, and site.py goes on silently.
    raise ModuleNotFoundError("No module named 'sitecustomize'", name="sitecustomize")
# The import machinery returns whatever sys.modules holds once this module ran: the user's.
sys.modules[__name__] = _user_sitecustomize
