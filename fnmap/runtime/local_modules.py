"""Which modules travel with a function by value: those loaded here and not installed.

cloudpickle pickles a function by reference to its module when the module can be imported where
the function runs; a module of the user's project (a file beside the script, a package not
installed) is not there, so it is registered to travel by value.  Installed means under one of
the interpreter's install folders or provided by an installed distribution (editable installs).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import cloudpickle

_local_seen: set[str] = set()
#: ``sys.modules``' size and last name at :func:`ship_local_modules`' last look.
_modules_seen: tuple | None = None
_site_roots: tuple[str, ...] | None = None


def install_roots() -> tuple[str, ...]:
    """The interpreter's install folders (standard library, site-packages, prefixes), each ending in
    a separator: a module under one is installed.  Found once a process (about 2 ms)."""
    global _site_roots
    if _site_roots is None:
        import site
        import sysconfig

        roots = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
        roots.update(site.getsitepackages() if hasattr(site, "getsitepackages") else [])
        roots.add(site.getusersitepackages() if hasattr(site, "getusersitepackages") else "")
        roots.update({sys.prefix, sys.base_prefix, sys.exec_prefix})
        _site_roots = tuple(os.path.realpath(r) + os.sep for r in roots if r)
    return _site_roots


_real_folders: dict[str, str] = {}


def _real_path(file: str) -> str:
    """``os.path.realpath(file)``, resolving each folder once for all the modules in it (a first
    map looked at some 200 modules, about eight system calls each: 12 ms)."""
    if os.path.islink(file):
        return os.path.realpath(file)
    folder, base = os.path.split(os.path.abspath(file))
    real = _real_folders.get(folder)
    if real is None:
        real = _real_folders[folder] = os.path.realpath(folder)
    return os.path.join(real, base)


def _is_local_module(name: str, module: Any) -> bool:
    file = getattr(module, "__file__", None)
    top = name.split(".")[0]
    # fnmap's own modules first: from a checkout they are outside the install folders, each a path to resolve.
    if not file or name == "__main__" or top in ("fnmap", "handlers") or _real_path(file).startswith(install_roots()):
        return False
    # Only modules outside the install folders need the metadata scan (editable installs): it
    # reads every distribution's RECORD, 0.3-0.6 s of a cold first job.
    return top not in _installed_top_level()


def _installed_top_level() -> set[str]:
    """Top-level names provided by installed distributions (editable installs included)."""
    from .installed import installed_top_level

    return installed_top_level()


def ship_local_modules() -> None:
    """Register every loaded module that is not installed for pickling by value (cloudpickle).

    Looks only when a module was imported since its last look: ``sys.modules`` is a dict, so a new
    name goes last, and the same count and last name mean no name that is not seen already (every
    ``Executor.submit`` pickles its function: a scan of a thousand modules was 15 % of a submit)."""
    global _modules_seen
    try:
        now = (len(sys.modules), next(reversed(sys.modules)))
    except (StopIteration, RuntimeError):  # emptied, or changed while read: look
        now = None
    if now is not None and now == _modules_seen:
        return
    _modules_seen = now
    for name, module in list(sys.modules.items()):
        if name in _local_seen or module is None:
            continue
        _local_seen.add(name)
        if _is_local_module(name, module):
            cloudpickle.register_pickle_by_value(module)


def explain_missing_module(name: str | None) -> str | None:
    """Why a module the worker could not import exists here, and the fix; None if it does not.

    A local module (a file beside the script, a package that is not installed) that the function
    imports *inside* its body is not shipped: only modules the function refers to as globals
    travel by value.
    """
    if not name:
        return None
    import importlib.util

    top = name.split(".")[0]
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or spec.origin in ("built-in", "frozen"):
        return None
    if os.path.realpath(spec.origin).startswith(install_roots()) or top in _installed_top_level():
        return (f"fnmap: module {top!r} is installed here ({spec.origin}): `fnmap deploy aws env "
                "--from-imports YOUR_SCRIPT.py --current` copies it from here into the Lambda function's layer "
                "(when this machine's Python and platform are the function's)")
    if top in cloudpickle.list_registry_pickle_by_value():
        return (f"fnmap: module {top!r} is a local module here ({spec.origin}) and travels by value with "
                f"the function, but something asked the worker to import it by name: an `import {top}` "
                f"inside the function (import it at module level instead), or an object of {top!r} whose "
                "type pickles itself by name (call it from a plain function of the module, or make the "
                "module a package installed on the workers).")
    return (f"fnmap: module {top!r} is a local module here ({spec.origin}), imported inside the function, "
            f"so it was not shipped with it. Import it at module level (`import {top}` at the top of "
            "the script or notebook): local modules the function uses as globals travel by value. Or "
            "make it a package installed on the workers.")


#: File-system timestamp granularity (50 ms, in ns): a file written this close to the look before its
#: module was imported may have been written after the import, so it counts as changed.
_STAMP_SLACK_NS = 50_000_000


class ModuleFiles:
    """The files of the user's modules a process imported, and which of them changed since.

    A worker that serves one client for as long as it lives (the emulator's) imports each module
    once: an editable package edited and reloaded in the client would run its old code there.  This
    keeps each module's file as it was when imported (its modification time and size) and says
    which differ now.  Watched: modules outside the install folders (the user's files, editable
    installs), not fnmap's, and, with ``baseline``, not those loaded when the watch started (the
    worker's own).  One look costs a ``stat`` per watched module, and a pass over ``sys.modules``
    when it grew.
    """

    def __init__(self, baseline: bool):
        self._skip: set[str] = set(sys.modules) if baseline else set()
        self._seen = 0  # len(sys.modules) at the last look: new modules are looked for when it differs
        self._files: dict[str, tuple[str, tuple]] = {}  # name -> (file, stamp when imported)
        self._looked_ns = 0

    def changed(self) -> list[str]:
        """Names of the watched modules whose file changed since they were imported (or since the
        last look said so); the modules imported since the last look start being watched."""
        modules = sys.modules
        if len(modules) != self._seen:
            for name in modules.keys() - self._skip - self._files.keys():
                self._watch(name, modules.get(name))
            for name in self._files.keys() - modules.keys():  # removed by the user: nothing to compare
                del self._files[name]
            self._seen = len(modules)
        self._looked_ns = time.time_ns()
        changed = []
        for name, (file, stamp) in self._files.items():
            now = _stamp(file)
            if now != stamp:
                changed.append(name)
                self._files[name] = (file, now)
        return changed

    def _watch(self, name: str, module: Any) -> None:
        file = getattr(module, "__file__", None)
        stamp = None
        if (file and name != "__main__" and name.split(".")[0] not in ("fnmap", "handlers")
                and not _real_path(file).startswith(install_roots())):
            stamp = _stamp(file)
        if stamp is None:  # not the user's file, or none to look at (a zip's member)
            self._skip.add(name)
            return
        # Imported since the last look: written that late, it may be newer than what was imported.
        self._files[name] = (file, stamp if stamp[0] < self._looked_ns - _STAMP_SLACK_NS else _WRITTEN_AROUND_IMPORT)

    def forget(self) -> list[str]:
        """Remove every watched module from ``sys.modules`` (the next import reads its file afresh, as
        a new process would, the modules that import it too); their names."""
        names = list(self._files)
        for name in names:
            sys.modules.pop(name, None)
        self._files.clear()
        self._seen = len(sys.modules)
        import importlib
        import linecache

        importlib.invalidate_caches()  # a module file added since is found
        linecache.checkcache()  # tracebacks quote the new source
        return names


#: The stamp of a file written about when its module was imported: compared, it differs from any.
_WRITTEN_AROUND_IMPORT = (-1, -1)


def _stamp(file: str) -> tuple | None:
    try:
        st = os.stat(file)
    except OSError:
        return None  # gone
    return st.st_mtime_ns, st.st_size
