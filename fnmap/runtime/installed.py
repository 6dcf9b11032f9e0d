"""The top-level names installed distributions provide, remembered between processes.

Deciding whether a loaded module outside the install folders is the user's own code (shipped by
value) or an editable install needs ``importlib.metadata.packages_distributions()``, which reads
every distribution's metadata: 0.3 - 0.6 s, paid by every fresh process whose function uses a local
module, on its first map (issue 25).  The answer changes only when something is installed or
removed, which changes the mtime of a folder on ``sys.path`` (a ``*.dist-info`` folder is added or
removed there), so it is kept in this user's cache folder under those folders and their mtimes.

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
    """The cache file for the current ``sys.path`` folders and their mtimes (None: none usable)."""
    state = []
    for entry in sys.path:
        try:
            state.append((entry, os.stat(entry or ".").st_mtime_ns))
        except OSError:
            state.append((entry, None))
    key = hashlib.sha256(json.dumps([sys.executable, state]).encode()).hexdigest()[:32]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "fnmap", "installed", key + ".json")


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
