"""Which modules travel with a function by value: those loaded here and not installed.

cloudpickle pickles a function by reference to its module when the module can be imported where
the function runs; a module of the user's project (a file beside the script, a package not
installed) is not there, so it is registered to travel by value.  Installed means under one of
the interpreter's install folders or provided by an installed distribution (editable installs).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import cloudpickle

_local_seen: set[str] = set()
_site_roots: tuple[str, ...] | None = None


def _install_roots() -> tuple[str, ...]:
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
    if not file or name == "__main__" or _real_path(file).startswith(_install_roots()):
        return False
    # Only modules outside the install folders need the metadata scan (editable installs): it
    # reads every distribution's RECORD, 0.3-0.6 s of a cold first job.
    top = name.split(".")[0]
    return top not in ("fnmap", "handlers") and top not in _installed_top_level()


def _installed_top_level() -> set[str]:
    """Top-level names provided by installed distributions (editable installs included)."""
    from .installed import installed_top_level

    return installed_top_level()


def ship_local_modules() -> None:
    """Register every loaded module that is not installed for pickling by value (cloudpickle)."""
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
    if os.path.realpath(spec.origin).startswith(_install_roots()) or top in _installed_top_level():
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
