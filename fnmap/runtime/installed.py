"""The top-level names installed distributions provide, remembered between processes.

Deciding whether a loaded module outside the install folders is the user's own code (shipped by
value) or an editable install needs ``importlib.metadata.packages_distributions()``, which reads
every distribution's metadata: 0.3 - 0.6 s, paid by every fresh process whose function uses a local
module, on its first map.  The answer changes only when something is installed or
removed, which adds, removes or rewrites a ``*.dist-info`` (or ``*.egg-info``) folder on ``sys.path``,
so it is kept in this user's cache folder under those metadata folders' names and mtimes.

A stale or edited cache can only make a module travel by value that need not, or not travel and
then fail on the worker with the missing-module hint: it runs no code.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

_names: set[str] | None = None


def installed_top_level() -> set[str]:
    """Top-level names provided by installed distributions (editable installs included)."""
    global _names
    if _names is None:
        path = _cache_path()
        names = _read(path) if path else None
        if names is None:
            import importlib.metadata

            names = set(importlib.metadata.packages_distributions())
            if path:
                _write(path, names)
        _names = names | {"fnmap", "handlers"}
    return _names


def _cache_path() -> str | None:
    """The cache file for the current ``sys.path`` folders that hold distributions, and their mtimes."""
    state = [(entry, _install_stamp(entry)) for entry in sys.path]
    key = hashlib.sha256(json.dumps([sys.executable, state]).encode()).hexdigest()[:32]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "fnmap", "installed", key + ".json")


def _install_stamp(entry: str) -> list | int | None:
    """What of a ``sys.path`` entry says which distributions it holds: the names and mtimes of its
    metadata folders (``*.dist-info``, ``*.egg-info``), or a zip's mtime.

    Not the folder's own mtime: the script's folder, the working directory or a project holding its
    ``*.egg-info`` change whenever any file is written there, and every run of a script in ``/tmp``
    then read all the metadata again.  Installing or removing a distribution adds, removes or
    rewrites a metadata folder, which changes the stamp.
    """
    try:
        with os.scandir(entry or ".") as listing:
            return sorted((e.name, e.stat().st_mtime_ns) for e in listing if e.name.endswith(_METADATA_SUFFIXES))
    except NotADirectoryError:  # a zip on sys.path
        pass
    except OSError:
        return None
    try:
        return os.stat(entry).st_mtime_ns
    except OSError:
        return None


_METADATA_SUFFIXES = (".dist-info", ".egg-info")


def _read(path: str) -> set[str] | None:
    try:
        with open(path) as f:
            names = json.load(f)
    except (OSError, ValueError):
        return None
    return set(names) if isinstance(names, list) and all(isinstance(n, str) for n in names) else None


def _write(path: str, names: set[str]) -> None:
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(sorted(names), f)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only home: the scan is simply made again next time
